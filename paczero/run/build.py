"""What a run is built from: the data, the task and the model, checked before any training.

:func:`build` loads the data first (cheap failures come before the model loads), then the tokenizer,
the task and the model. :func:`build_together` does the same on every rank of a data-parallel run and
stops them together on bad input. Also here: the micro-batches of a step (:func:`step_batches`), the
dev/test evaluation and the trainable weights' save/load helpers, which the training loop, the
data-parallel ranks, ``paczero eval`` and ``paczero audit`` share.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paczero.checkpoint import CheckpointError
from paczero.config import AUTO, DP_MECHANISMS, ConfigError, TrainConfig
from paczero.machine.hardware import announce, resolve_device, resolve_precision


def environment(device: str) -> dict[str, Any]:
    """Where a run ran (summary.json ``environment``): the versions of paczero, torch and Python, the OS, and
    the device: the GPU's name, or the CPU's model and the intra-op threads torch uses."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("paczero")
    except PackageNotFoundError:  # pragma: no cover - a source checkout that is not installed
        ours = None
    if device.startswith("cuda") and torch.cuda.is_available():
        hardware = torch.cuda.get_device_name(torch.device(device))
    else:
        hardware = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                hardware = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                                hardware)
        except OSError:
            pass
        n = torch.get_num_threads()
        hardware = f"{hardware}, {n} thread{'' if n == 1 else 's'}"
    return {"paczero": ours, "torch": torch.__version__, "python": platform.python_version(),
            "os": platform.platform(terse=True), "device": device, "hardware": hardware}


@dataclass
class Setup:
    """Everything a run needs, built once (also used by eval and audit)."""
    cfg: TrainConfig
    device: str
    model: torch.nn.Module
    tokenizer: Any
    task: Any
    train: list
    dev: list
    test: list
    universe: list
    dev_enc: list
    test_enc: list
    in_memory: tuple = ()  # what was given as objects in memory (Given.names), not loaded from the config
    ood_enc: list | None = None  # the encoded out-of-domain test file (config ood_data), evaluated at the end
    data_use: str | None = None  # the API: what each dataset given was used for
    prompt: dict | None = None  # classification: the prompt and answer words scored (paczero.tasks.prompts.prompt_record)
    planted: Any = None  # config canaries: the canaries and which trained (paczero.audit.canaries.Planted: private)


@dataclass
class Given:
    """Objects given in memory in place of what the config names (the Python API, :mod:`paczero.api`): a
    model (a transformers causal LM, or a peft model of one), a tokenizer, the (train, dev, test) examples.
    :func:`build` prepares the model as :func:`paczero.models.load_model` prepares a loaded one and leaves
    the model it trains in ``prepared`` (track lora: the peft wrapper of a plain model)."""
    model: Any = None
    tokenizer: Any = None
    examples: tuple[list, list, list] | None = None
    prepared: Any = None
    data_use: str | None = None  # what each dataset given was used for (run.json data_use)

    def names(self) -> tuple[str, ...]:
        return tuple(name for name, value in (("model", self.model), ("tokenizer", self.tokenizer),
                                              ("data", self.examples)) if value is not None)


def build(cfg: TrainConfig, *, with_model: bool = True, examples: tuple[list, list, list] | None = None,
          given: Given | None = None) -> Setup:
    """Load data (first: cheap failures come before the model loads), then the model. ``examples``:
    (train, dev, test) given instead of the config's data (``paczero eval --data`` leaves train empty).
    ``given``: objects that replace loading the config's model, tokenizer or data."""
    import copy

    from paczero.models import check_model_source, load_tokenizer, prepare_tokenizer
    from paczero.tasks import load_splits

    device = resolve_device(cfg.device)
    given = given or Given()
    if given.model is None:
        check_model_source(cfg.model)
    examples = examples if examples is not None else given.examples
    if examples is not None:
        train_ex, dev_ex, test_ex = examples
    else:
        train_ex, dev_ex, test_ex = load_splits(cfg.task, source=cfg.data, n_train=cfg.n_train, n_dev=cfg.n_dev,
                                                n_test=cfg.n_test, seed=cfg.data_seed, columns=cfg.columns,
                                                labels=cfg.labels, classes=classes_of(cfg),
                                                stable=cfg.mechanism in DP_MECHANISMS,
                                                data_fraction=cfg.data_fraction,
                                                dev_source=cfg.dev_data, test_source=cfg.test_data)
    if examples is None and len(train_ex) < 2:  # a DP run's U size is private: the line names none
        got = "" if cfg.mechanism in DP_MECHANISMS else f", got {len(train_ex)}"
        raise ConfigError(f"the training universe needs at least 2 examples{got}")
    if given.tokenizer is not None:  # a copy: the caller's own tokenizer keeps its padding side
        tokenizer = prepare_tokenizer(copy.deepcopy(given.tokenizer))
    else:  # the prompts are built and checked (labels, template) before the model
        tokenizer = load_tokenizer(cfg.model)
    auto = cfg.template == AUTO  # the prompt is chosen on dev once the model is loaded
    options = _auto_options(cfg, tokenizer, dev_ex) if auto else None
    task = options[0] if auto else _task(cfg, tokenizer, cfg.template, cfg.verbalizer)
    ood_ex = _ood_examples(cfg) if cfg.ood_data and examples is None else None
    splits = (train_ex, dev_ex, test_ex)
    encoded = None if auto else _encode(cfg, task, splits)
    model, device, cfg = _model(cfg, given, tokenizer, device) if with_model else (None, device, cfg)
    if auto:
        if model is None:
            raise ConfigError("template auto scores its candidates with the model, which this command does not load")
        task, prompt = _choose_prompt(cfg, options, model, dev_ex)
        cfg = cfg.replace(template=task.template, verbalizer=dict(task.verbalizer))
        encoded = _encode(cfg, task, splits)
    else:
        prompt = _stated_prompt(cfg, task)
    return Setup(cfg, device, model, tokenizer, task, train_ex, dev_ex, test_ex, *encoded, in_memory=given.names(),
                 ood_enc=None if ood_ex is None else task.encode(ood_ex), data_use=given.data_use, prompt=prompt)


def _model(cfg: TrainConfig, given: Given, tokenizer, device: str):
    """The model (loaded as the config names it, or the one given, prepared), the device its inputs go to, and
    the config (its dtype and mu resolved where they were not yet)."""
    from paczero.models import load_model, prepare_model

    announce()  # train's choice of dtype, held back until every input is checked
    if given.model is not None:
        placed = _placed(given.model)  # sharded or quantised: it stays where it is
        model = given.prepared = prepare_model(
            given.model, tokenizer, track=cfg.track, dtype=getattr(given.model, "dtype", torch.float32),
            device=None if placed else device, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
            lora_targets=cfg.lora_targets, init_seed=cfg.seed)
        if placed:
            device = str(model.get_input_embeddings().weight.device)
        return model, device, cfg
    if cfg.dtype == "auto" or cfg.mu is None:  # a config not resolved by train (paczero eval --dtype auto)
        cfg = resolve_precision(cfg, device, mu_applies=False)
    model = load_model(cfg.model, dtype=cfg.dtype, device=device, track=cfg.track, lora_r=cfg.lora_r,
                       lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets, init_seed=cfg.seed,
                       device_map=cfg.device_map, tokenizer=tokenizer).model
    given.prepared = model
    if cfg.device_map:  # inputs go where the embeddings live
        device = str(model.get_input_embeddings().weight.device)
    return model, device, cfg


def _encode(cfg: TrainConfig, task, splits) -> list[list]:
    """The train, dev and test examples encoded once; one warning for those cut to max_length."""
    encoded, cut = [], []
    for examples_of_split in splits:
        encoded.append(task.encode(examples_of_split))
        cut.append(getattr(task, "truncated", 0))
    _warn_truncated(cfg, cut, [len(split) for split in splits])
    return encoded


def _stated_prompt(cfg: TrainConfig, task) -> dict | None:
    """A classification run's prompt record (None for the other tasks): set by the config, or the task's."""
    if not hasattr(task, "verbalizer"):
        return None
    from paczero.tasks.prompts import prompt_record

    return prompt_record(task, "config" if cfg.template is not None or cfg.verbalizer is not None else "task default")


def _auto_options(cfg: TrainConfig, tokenizer, dev_ex: list) -> list:
    """template auto's candidate tasks (paczero/tasks/prompts.yaml), built (their answer words tokenised) before
    the model loads."""
    from paczero.tasks.prompts import candidates

    if not dev_ex:
        raise ConfigError("template auto chooses the prompt on dev examples, and there are none here")
    own_file = cfg.data not in (None, "demo")  # a file of one's own: a prompt of its column names too
    try:
        found = candidates(len(classes_of(cfg) or (0, 1)), cfg.labels, cfg.verbalizer,
                           own=getattr(cfg, "template_candidates", None), columns=cfg.columns or {} if own_file else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return [_task(cfg, tokenizer, c["template"], c["verbalizer"]) for c in found]


def _choose_prompt(cfg: TrainConfig, options: list, model, dev_ex: list):
    """template auto: each candidate task scored zero-shot on the dev examples (the only examples this reads),
    the one of lowest dev loss kept (a sentiment prompt for a run not about sentiment only where it is also
    the most accurate: :func:`paczero.tasks.prompts.choose`); then, where the run names its classes but gives
    no answer words, the kept prompt with each other form of the names as its words
    (:func:`paczero.tasks.answer_words.word_sets`), the lowest dev loss of all kept. Returns the task and the
    prompt record (every candidate's dev metrics). One warning where even the kept one scores near chance."""
    from paczero.tasks.answer_words import about_sentiment, word_sets
    from paczero.tasks.prompts import choose, near_chance_line, pick, prompt_record, sentiment_templates
    from paczero.machine.thread_share import refresh

    def dev_score(candidate: dict) -> dict:
        task = options[found.index(candidate)]
        refresh()
        with torch.inference_mode():
            metrics = task.evaluate(model, task.encode(dev_ex), token_budget=cfg.token_budget)
        return {k: float(v) for k, v in metrics.items()}

    off = set() if about_sentiment(cfg.task, cfg.labels, cfg.verbalizer, cfg.columns) else sentiment_templates()
    found = [{"template": t.template, "verbalizer": dict(t.verbalizer)} for t in options]
    best, scored = choose(found, dev_score, [i for i, c in enumerate(found) if c["template"] in off])
    if cfg.labels and cfg.verbalizer is None:  # the kept prompt with the other forms of the class names
        template = found[best]["template"]
        for words in word_sets(cfg.labels, options[best].tokenizer):
            if {"template": template, "verbalizer": words} not in found:
                options.append(_task(cfg, options[best].tokenizer, template, words))
                found.append({"template": template, "verbalizer": words})
                scored.append({**found[-1], "dev": dev_score(found[-1])})
        best = pick(scored, [i for i, c in enumerate(found) if c["template"] in off])
    record = prompt_record(options[best], "auto", scored)
    line = near_chance_line(record, len(dev_ex), options[best].num_classes)
    if line:
        logging.getLogger(__name__).warning(line)
    return options[best], record


def _task(cfg: TrainConfig, tokenizer, template, verbalizer):
    from paczero.tasks import build_task

    return build_task(cfg.task, tokenizer, template=template, verbalizer=verbalizer, objective=cfg.objective,
                      max_new_tokens=cfg.max_new_tokens, answer_stop=cfg.answer_stop, max_length=cfg.max_length,
                      labels=cfg.labels, fill_batches=fills_batches(resolve_device(cfg.device), cfg.dtype))


def fills_batches(device: str, dtype: str = "fp32") -> bool:
    """Whether a task on ``device`` in ``dtype`` fills its micro-batches to the token budget rather than cutting
    them at 10 % padding. On a GPU, where a forward of a small model costs mostly its kernel launches (a pass over
    SST-2's U at N = 1000 is 15 micro-batches near zero padding, 2 filled to a budget of 32,768 tokens); on a CPU
    in bf16 with native bf16 arithmetic, whose matrix products run far below their rate on the few rows of a tight
    micro-batch (a pass over 64 AG News items 1.2-1.4x faster filled, 128 SST-5 sentences 1.23x, though 20 % more
    tokens are padded: docs/performance.md, "Micro-batches on a CPU"). In fp32 on a CPU padded tokens cost compute
    (the same passes 0.87x and 0.92x filled): tight."""
    if str(device).startswith("cuda"):
        return True
    if dtype != "bf16":
        return False
    from paczero.machine.hardware import native_bf16

    return native_bf16("cpu")[0]


def _ood_examples(cfg: TrainConfig) -> list:
    """Every example of ``cfg.ood_data`` (its test rows where it has a split column), read with the training
    file's task, columns and labels."""
    from paczero.tasks import load_splits
    from paczero.tasks.data import read_records

    path = Path(cfg.ood_data).expanduser()
    if not path.is_file():
        raise ConfigError(f"ood_data {cfg.ood_data!r}: no such file")
    records = read_records(path)
    has_split = bool(records) and "split" in records[0]
    try:
        _, _, rows = load_splits(cfg.task, source=str(path), n_train=0, n_dev=0, columns=cfg.columns,
                                 n_test=None if has_split else len(records), labels=cfg.labels,
                                 classes=classes_of(cfg))
    except ValueError as e:
        raise ConfigError(f"ood_data: {e}") from None
    return rows


def classes_of(cfg: TrainConfig) -> frozenset[int] | None:
    """The integer labels the config's classification task scores (None for the other tasks)."""
    from paczero.tasks.data import class_labels

    return class_labels(cfg.task, cfg.verbalizer, cfg.labels)


def refuse_in_memory(record: dict, run: str, what: str, data_given: bool = False) -> None:
    """One line for ``paczero eval``/``audit`` on a run trained on objects given in memory (run.json's
    ``in_memory``): its config names them but cannot rebuild them (``data_given``: ``--data`` replaces the
    run's examples)."""
    gone = [name for name in record.get("in_memory", ()) if not (name == "data" and data_given)]
    if gone:
        raise ConfigError(f"run {run!r} was trained on objects given in memory ({', '.join(gone)}), which its "
                          f"run.json cannot rebuild for {what}; its released model is in {run}/model")


def _placed(model) -> bool:
    """Whether a model given in memory is sharded over devices (``device_map``) or quantised: moving it is
    not ours to do."""
    from paczero.models import hf_model

    hf = hf_model(model)
    return bool(getattr(hf, "hf_device_map", None)) or bool(getattr(hf, "is_quantized", False))


def _warn_truncated(cfg: TrainConfig, cut: list[int], sizes: list[int]) -> None:
    """One warning naming how many examples of each split lost tokens to ``max_length`` (the DP baselines'
    universe is private under add-or-remove adjacency: its rows are not named, nor whether any was cut)."""
    if not any(cut):
        return
    private = cfg.mechanism in DP_MECHANISMS  # whether a private training row is long is not said either
    parts = [f"{c} of {n} {name}" for c, n, name in zip(cut, sizes, ("training", "dev", "test"))
             if c and not (private and name == "training")]
    if not parts:
        return
    logging.getLogger(__name__).warning(
        f"{', '.join(parts)} examples are longer than max_length ({cfg.max_length} tokens) and lose tokens from "
        "the left (the start of their text); raise --max-length to keep them whole")


def data_fingerprint(setup: Setup) -> str:
    """sha256 of the examples of the three splits (public: it identifies the data, not S*)."""
    import hashlib

    h = hashlib.sha256()
    for split in (setup.train, setup.dev, setup.test):
        h.update(json.dumps(split, sort_keys=True, default=str).encode())
        h.update(b"|")
    return h.hexdigest()


def tokens_fingerprint(setup: Setup) -> str:
    """sha256 of the tokenised universe: ranks whose tokenizers differ would score other sequences."""
    import dataclasses
    import hashlib

    h = hashlib.sha256()
    for enc in setup.universe:
        for field in dataclasses.fields(enc):
            value = getattr(enc, field.name)
            h.update(value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
            h.update(b"|")
    return h.hexdigest()


def build_together(cfg: TrainConfig, dp, resumed_run: dict | None = None,
                   given: Given | None = None) -> tuple[Setup, str]:
    """:func:`build` on every rank, and the data's fingerprint. The ranks stop together (``dp.agree``)
    when one of them fails on bad input, when their examples or tokens differ, or when the data differ
    from those of the run being resumed (``resumed_run``: its run.json, on rank 0). ``given``: objects
    given in memory (a single process only)."""
    setup, value, problem = None, None, None
    try:
        setup = build(cfg, given=given)
        check_sizes(setup)
        value = {"examples": data_fingerprint(setup), "tokens": tokens_fingerprint(setup)}
        recorded = None if resumed_run is None else resumed_run.get("data_fingerprint")
        if recorded is not None and recorded != value["examples"]:
            raise ConfigError("cannot resume: the data (universe, dev or test examples) differ from the original run")
    except ValueError as e:
        problem = e
    dp.agree("data", value, problem)
    return setup, value["examples"]


def split_sizes(setup: Setup) -> dict[str, int]:
    """The sizes of a run's universe, dev and test sets: what its summary, statement and card state (the
    universe's training rows: not the canaries a run with config canaries trains on besides). A DP run's universe
    is stated as the public ``n_train`` (its expected size: the true one is private under add-or-remove adjacency,
    :func:`paczero.tasks.split.stable_split`)."""
    universe = setup.cfg.n_train if stable_universe(setup) else len(setup.train)
    return {"universe": universe, "dev": len(setup.dev_enc), "test": len(setup.test_enc)}


def stable_universe(setup: Setup) -> bool:
    """Whether the run's U was drawn by the stable split (a DP run on a file or on rows given in memory): its
    size is then private, and every public place states the public n_train."""
    return setup.cfg.mechanism in DP_MECHANISMS and (setup.cfg.data not in (None, "demo") or "data" in setup.in_memory)


#: fewer dev or test rows than this and a run says once that their scores resolve little
RESOLVING_ROWS = 50


def small_splits_note(setup: Setup) -> str | None:
    """One line for a run whose dev or test set has fewer than RESOLVING_ROWS rows: a score on n rows moves
    in steps of 1/n and its 95 % interval spans about ±1/sqrt(n) (a proportion near 0.5: 1.96 * 0.5/sqrt(n)),
    so such a run's dev selection and test scores tell apart only large differences."""
    small = {name: n for name, n in split_sizes(setup).items() if name != "universe" and n < RESOLVING_ROWS}
    if not small:
        return None
    sets = " and ".join(f"{name} {n} rows" for name, n in small.items())
    spans = ", ".join(f"±{0.98 / n ** 0.5:.0%} on {name}" for name, n in small.items() if n)
    how = ("more rows in eval_dataset and test_dataset, or n_dev and n_test" if "data" in setup.in_memory else
           "a file with more rows, or --n-dev and --n-test")
    return (f"paczero: data: {sets}: their scores resolve little (a 95 % interval spans about {spans}); "
            f"at least {RESOLVING_ROWS} rows each ({how}) resolve more")


def near_chance(setup: Setup, dev: dict) -> str | None:
    """One line when a classification run's zero-shot dev accuracy is within reach of chance (1/classes plus
    the larger of 0.1 and 1/sqrt(dev rows)): the prompt or its answer words may not suit the model or the data."""
    if setup.prompt is None or dev.get("accuracy") is None or not setup.dev_enc:
        return None
    if setup.prompt.get("source") == "auto":  # template auto said so when it chose (near_chance_line)
        return None
    chance = 1 / setup.task.num_classes
    if dev["accuracy"] > chance + max(0.1, 1 / len(setup.dev_enc) ** 0.5):
        return None
    return (f"paczero: zero-shot dev accuracy {dev['accuracy']:.3f} is near chance ({chance:.2f}): the prompt or its "
            "answer words may not suit this model and data; --template auto chooses among candidates on dev, "
            "--verbalizer sets the answer words")


def check_sizes(setup: Setup) -> None:
    """The config records the sizes the run uses (its ``n_train``, ``n_dev``, ``n_test`` are what run.json,
    the privacy statement and the model card state): a run whose examples have other sizes is a bug."""
    cfg, sizes = setup.cfg, split_sizes(setup)
    stated = {"universe": cfg.n_train, "dev": cfg.n_dev, "test": cfg.n_test if cfg.n_test is not None else sizes["test"]}
    if stable_universe(setup):  # dev and test: every row the stable split drew for them (expected sizes)
        stated.update(dev=sizes["dev"], test=sizes["test"])
    if sizes != stated:
        raise RuntimeError(f"the run's examples ({sizes}) are not the sizes its config states ({stated})")


def step_batches(task, universe: list, full_batches: list, idx, token_budget: int) -> tuple[list, int]:
    """The micro-batches a step scores and their row count: the prebuilt ones for the whole
    universe (``idx is None``), else those of the mechanism's subsample (possibly empty)."""
    if idx is None:
        return full_batches, len(universe)
    subset = [universe[i] for i in idx]
    batches = task.make_batches(subset, token_budget=token_budget) if subset else []
    return batches, len(subset)


def evaluate(setup: Setup, enc: list) -> dict[str, float]:
    from paczero.machine.thread_share import refresh

    refresh()  # the threads of this process's share of its cores (paczero/machine/thread_share.py)
    with torch.inference_mode():
        return {k: float(v) for k, v in setup.task.evaluate(setup.model, enc, token_budget=setup.cfg.token_budget).items()}


def evaluate_per_class(setup: Setup, enc: list) -> tuple[dict[str, float], dict[str, float] | None]:
    """:func:`evaluate`'s loss and accuracy and, for a classification task, each class's recall on ``enc`` (the
    share of its rows predicted right, keyed by class name, from the same pass; None for a class with no row there);
    None for other tasks."""
    if not hasattr(setup.task, "report"):
        return evaluate(setup, enc), None
    from paczero.machine.thread_share import refresh

    refresh()
    with torch.inference_mode():
        r = setup.task.report(setup.model, enc, token_budget=setup.cfg.token_budget)
    recall = {name: float(c["recall"]) if c["support"] else None for name, c in r["per_class"].items()}
    return {"loss": float(r["loss"]), "accuracy": float(r["accuracy"])}, recall


def trainable_state(params) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params}


def load_trainable(params, weights: dict[str, torch.Tensor]) -> None:
    missing = [n for n, _ in params if n not in weights]
    if missing:
        raise CheckpointError(f"checkpoint lacks trainable weight {missing[0]!r} (different model or track?)")
    with torch.no_grad():
        for name, p in params:
            p.data.copy_(weights[name].to(device=p.device, dtype=p.dtype))
