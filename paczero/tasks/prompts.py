"""The prompt of a classification run: its template, the answer words it scores, where they came from, and
``template: auto``'s choice among the candidates of ``prompts.yaml`` (next to this file).

:func:`candidates` lists the candidates that fit a run's classes; :func:`choose` keeps the one with the
lowest zero-shot dev loss (a tie: the earlier in the file), given a function that scores a candidate on dev
(:func:`paczero.run.build.build` passes one that reads the dev examples alone); :func:`prompt_record` is what
run.json, summary.json and the model card state, and :func:`prompt_line` the line a run prints.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
LABEL_WORDS = "labels"  # a candidate's verbalizer: the run's label names, each after a space


def candidates(num_classes: int, label_names: Sequence[str] | None = None,
               verbalizer: Mapping[int, str] | None = None, path: Path = PROMPTS_FILE,
               own: Sequence[str] | None = None, columns: Mapping[str, str] | None = None) -> list[dict]:
    """The candidates that fit a run: ``{"template", "verbalizer"}`` with integer labels, without repeats: the
    user's ``own`` templates first, then the prompt of the file's column names where ``columns`` is given
    (:func:`paczero.tasks.answer_words.column_template`), then those of ``path`` in file order. ``verbalizer``
    (given by the user) replaces every candidate's words; otherwise a candidate of ``labels`` words applies
    where the run names its labels, and one of fixed words where it has as many words as the run has classes
    (an own or column template takes the label names, else each set of fixed words that fits). A template's
    ``{labels}`` is the candidate's answer words in words ("billing, technical or account"): such a candidate
    applies where the run names its labels."""
    from paczero.tasks.answer_words import column_template

    named = {i: " " + str(name).strip() for i, name in enumerate(label_names or [])}
    entries = yaml.safe_load(path.read_text())
    fixed = [e["verbalizer"] for e in entries if e["verbalizer"] != LABEL_WORDS]
    found: list[dict] = []
    mine = [*(own or ()), *([column_template(columns)] if columns is not None else [])]
    for template in mine:  # the user's templates, with the label names or each fitting set of words
        for words in ([verbalizer] if verbalizer is not None else [named] if named else fixed):
            _add(found, template, words, num_classes, label_names)
    for entry in entries:
        words = entry["verbalizer"]
        if verbalizer is not None:
            words = dict(verbalizer)
        elif words == LABEL_WORDS:
            if not label_names:
                continue
            words = named
        _add(found, entry["template"], words, num_classes, label_names)
    if not found:
        raise ValueError(f"template auto has no candidate for {num_classes} classes without their names: give "
                         "--labels (the names become candidates' answer words) or --verbalizer")
    return found


def _add(found: list, template: str, words: Mapping, num_classes: int, label_names: Sequence[str] | None) -> None:
    """Append the candidate of ``template`` and ``words`` to ``found`` where it fits (as many words as classes; a
    ``{labels}`` template only with label names) and is not there yet."""
    if len(words) != num_classes or ("{labels}" in template and not label_names):
        return
    if "{labels}" in template:
        names = [str(words[k]).strip().replace("{", "{{").replace("}", "}}") for k in sorted(words)]
        template = template.replace("{labels}", ", ".join(names[:-1]) + " or " + names[-1])
    candidate = {"template": template, "verbalizer": {int(k): str(v) for k, v in words.items()}}
    if candidate not in found:
        found.append(candidate)


def near_chance_line(record: Mapping, dev_rows: int, num_classes: int) -> str | None:
    """One line where template auto's chosen candidate scores a dev accuracy within reach of chance (1/classes
    plus the larger of 0.1 and 1/sqrt(dev rows)): none of the candidates suits this model and data."""
    chosen = next((c for c in record.get("candidates") or () if c["template"] == record["template"]
                   and c["verbalizer"] == record["verbalizer"]), None)
    accuracy = None if chosen is None else chosen["dev"].get("accuracy")
    chance = 1 / num_classes
    if accuracy is None or not dev_rows or accuracy > chance + max(0.1, 1 / dev_rows ** 0.5):
        return None
    return (f"template auto: the best of its {len(record['candidates'])} candidates, {json.dumps(record['template'])}, "
            f"scores dev accuracy {accuracy:.3f}, near chance ({chance:.2f}): none suits this model and data; give "
            "your own prompts (--template-candidates 'Ticket: {sentence}\\nTopic:' ...), or answer words the model "
            "knows for your labels (--labels CODE=word,... as ABBR=abbreviation,HUM=person; or --verbalizer)")


def choose(found: Sequence[dict], dev_score: Callable[[dict], dict],
           off_topic: Sequence[int] = ()) -> tuple[int, list[dict]]:
    """The index of the candidate with the lowest dev loss (a tie: the earlier), and every candidate with its
    dev metrics (``dev_score(candidate)``: the zero-shot metrics on dev, never on test). A candidate of
    ``off_topic`` (a sentiment prompt for a run not about sentiment) is kept only where dev says it is the best
    on both counts: the lowest loss and no other candidate of higher accuracy; else the lowest loss of the
    others."""
    scored = [{**c, "dev": dev_score(c)} for c in found]
    return pick(scored, off_topic), scored


def pick(scored: Sequence[dict], off_topic: Sequence[int] = ()) -> int:
    """:func:`choose`'s rule over candidates already scored."""
    best = min(range(len(scored)), key=lambda i: (scored[i]["dev"]["loss"], i))
    others = [i for i in range(len(scored)) if i not in set(off_topic)]
    if best in set(off_topic) and others:
        accuracy = [scored[i]["dev"].get("accuracy", float("-inf")) for i in range(len(scored))]
        if max(accuracy[i] for i in others) > accuracy[best]:
            best = min(others, key=lambda i: (scored[i]["dev"]["loss"], i))
    return best


def sentiment_templates(path: Path = PROMPTS_FILE) -> set[str]:
    """The templates of ``path`` marked ``about: sentiment``."""
    return {e["template"] for e in yaml.safe_load(path.read_text()) if e.get("about") == "sentiment"}


def prompt_record(task, source: str, scored: Sequence[dict] | None = None) -> dict[str, Any]:
    """What a classification run states about its prompt: ``template``, ``verbalizer`` (label -> answer word,
    keys as JSON writes them), ``labels`` (the names, or None), ``source`` ("auto": chosen on dev;
    "config": set by the run's settings; "task default") and, for auto, ``candidates`` with their dev metrics."""
    record = {"template": task.template, "verbalizer": {str(k): v for k, v in sorted(task.verbalizer.items())},
              "labels": list(task.label_names) if task.label_names else None, "source": source}
    if scored is not None:
        record["candidates"] = [{"template": c["template"],
                                 "verbalizer": {str(k): v for k, v in sorted(c["verbalizer"].items())},
                                 "dev": c["dev"]} for c in scored]
    return record


def answer_words(record: Mapping) -> str:
    """``neg " terrible", pos " great"`` (label names where given, else the integer labels)."""
    names = record.get("labels") or []
    return ", ".join(f"{names[int(k)] if int(k) < len(names) else k} {json.dumps(v)}"
                     for k, v in record["verbalizer"].items())


def prompt_line(record: Mapping) -> str:
    """The one line a run prints about its prompt: the template, the answer words and where they came from."""
    how = {"config": "as set", "task default": "the task's default"}.get(record["source"], "")
    if record["source"] == "auto":
        chosen = next(c for c in record["candidates"]
                      if c["template"] == record["template"] and c["verbalizer"] == record["verbalizer"])
        others = sorted(c["dev"]["loss"] for c in record["candidates"] if c is not chosen)
        how = (f"chosen on dev by template auto among {len(record['candidates'])} candidates: dev loss "
               f"{chosen['dev']['loss']:.3f}" + (f", the others {others[0]:.3f}-{others[-1]:.3f}" if others else "")
               + "; run.json prompt")
    return f"paczero: prompt {json.dumps(record['template'])}, answer words {answer_words(record)} ({how})"
