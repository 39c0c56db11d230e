"""template auto's candidates that come from the run itself rather than from ``prompts.yaml``: answer words
formed from the class names, a prompt formed from the file's column names, and whether the run is about
sentiment (where the sentiment prompts of ``prompts.yaml`` belong).
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

#: words that mark a run as one about sentiment: in its class names, answer words or column names
SENTIMENT_WORDS = frozenset({"sentiment", "review", "reviews", "polarity", "positive", "negative", "pos", "neg",
                             "good", "bad", "great", "terrible", "opinion", "rating", "ratings", "stars", "emotion",
                             "feeling", "mood", "tone"})


def first_word(name: str) -> str:
    """The first run of letters and digits of ``name`` (``"Sci/Tech"``: ``"Sci"``), or the name stripped."""
    found = re.findall(r"[^\W_]+", name)
    return found[0] if found else name.strip()


def word_sets(names: Sequence[str], tokenizer) -> list[dict[int, str]]:
    """The answer-word candidates of named classes (label i -> ``" word"``), in order: the names, lower-cased,
    their first word, the first word lower-cased, and the single-token forms (the first token of each lower-cased
    first word, where it is longer). A set is kept where its words are distinct, non-empty and not a set kept
    before."""
    names = [str(n).strip() for n in names]
    firsts = [first_word(n) for n in names]
    single = []
    for word in (f.lower() for f in firsts):
        ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        single.append(tokenizer.decode(ids[:1]).strip() if ids else word)
    found: list[dict[int, str]] = []
    for forms in (names, [n.lower() for n in names], firsts, [f.lower() for f in firsts], single):
        words = {i: " " + w.strip() for i, w in enumerate(forms)}
        if all(w.strip() for w in words.values()) and len(set(words.values())) == len(words) and words not in found:
            found.append(words)
    return found


def column_template(columns: Mapping[str, str] | None) -> str:
    """The prompt a file's own column names make: ``"Question: {sentence}\\nCategory:"`` for a text column
    ``question`` and a label column ``category`` (unmapped fields: ``sentence``, ``label``)."""
    columns = columns or {}

    def title(name: str) -> str:
        words = re.sub(r"[_\s]+", " ", str(name)).strip() or "text"
        return (words[0].upper() + words[1:]).replace("{", "{{").replace("}", "}}")

    return f"{title(columns.get('sentence', 'sentence'))}: {{sentence}}\n{title(columns.get('label', 'label'))}:"


def about_sentiment(task: str, names: Sequence[str] | None, words: Mapping | None,
                    columns: Mapping[str, str] | None) -> bool:
    """Whether a run is about sentiment: the SST-2 and demo tasks; a run with neither class names nor answer
    words (integer labels say nothing: the paper's two-class convention stands); or one whose class names,
    answer words or column names hold a word of :data:`SENTIMENT_WORDS`."""
    if task in ("sst2", "demo") or (not names and not words):
        return True
    text = " ".join([*(names or ()), *(words or {}).values(), *(columns or {}).values()]).lower()
    return bool(set(re.findall(r"[a-z]+", text)) & SENTIMENT_WORDS)
