"""Tasks: what a training example is, how it is batched and what its loss is.

``build_task(name, tokenizer, **options)`` returns a task object with

- ``encode(examples) -> list[Encoded]``: tokenise once, same order;
- ``make_batches(enc, token_budget=4096, indices=None) -> list[Batch]``:
  length-sorted, left-padded micro-batches, built once and reused (near zero
  padding, or filled to the budget where the task was built with
  ``fill_batches=True``);
- ``losses(model, batch) -> Tensor[B]``: the per-sample fp32 training loss
  (one ordinary forward, so perturbation hooks fire);
- ``evaluate(model, enc, token_budget=4096) -> dict``: batched metrics;
- ``metric``: the dev-selection metric (higher is better; ``"loss"``, the
  completion task's, lower).

``load_splits(name, ...)`` returns ``(train, dev, test)`` lists of dicts.
"""

from __future__ import annotations

from paczero.tasks.batching import Batch, Encoded, collect
from paczero.tasks.classification import SST2_TEMPLATE, SST2_VERBALIZER, ClassificationTask
from paczero.tasks.data import TASK_ALIASES, canonical_task
from paczero.tasks.split import load_splits

__all__ = [
    "Batch",
    "ClassificationTask",
    "Encoded",
    "SST2_TEMPLATE",
    "SST2_VERBALIZER",
    "TASKS",
    "build_task",
    "canonical_task",
    "collect",
    "load_splits",
]

TASKS = sorted(set(TASK_ALIASES.values()))


def build_task(name: str, tokenizer, **options):
    """The task called ``name`` (``sst2``, ``classification``, ``demo``, ``squad`` or ``completion``; aliases allowed).

    Classification options: ``template``, ``verbalizer`` (dict label -> option
    string), ``max_length`` (512), ``scoring``. SQuAD options: ``objective``
    (``"nll"`` or ``"f1"``), ``max_new_tokens`` (50), ``max_length`` (2048),
    ``answer_stop`` (``"newline-token"`` or ``"any-newline"``).
    Classification also takes ``labels`` (the class names, label i the i-th).
    Completion options: ``max_length`` (2048), ``max_new_tokens`` (50).
    Every task takes ``fill_batches`` (False): True fills each micro-batch to
    the token budget whatever its padding (a GPU), False keeps micro-batches
    near zero padding (a CPU, where padded tokens cost compute).
    Options set to ``None`` take their defaults; options that only the other
    kind of task takes are ignored; unknown option names raise ``ValueError``.
    """
    task = canonical_task(name)
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - _CLASSIFICATION_OPTIONS - _QA_OPTIONS - _COMPLETION_OPTIONS)
    if unknown:
        known = sorted(_CLASSIFICATION_OPTIONS | _QA_OPTIONS | _COMPLETION_OPTIONS)
        raise ValueError(f"unknown task option(s) {unknown}; known: {known}")
    if task in ("sst2", "classification", "demo"):
        mine = {k: v for k, v in options.items() if k in _CLASSIFICATION_OPTIONS}
        if "labels" in mine:
            mine["label_names"] = mine.pop("labels")
        return ClassificationTask(tokenizer, name=task, **mine)
    if task == "completion":
        from paczero.tasks.completion import CompletionTask

        return CompletionTask(tokenizer, **{k: v for k, v in options.items() if k in _COMPLETION_OPTIONS})
    from paczero.tasks.qa import SquadTask

    return SquadTask(tokenizer, **{k: v for k, v in options.items() if k in _QA_OPTIONS})


# Options meant for the other kind of task are ignored, so one config can carry both.
_CLASSIFICATION_OPTIONS = {"template", "verbalizer", "max_length", "scoring", "labels", "fill_batches"}
_QA_OPTIONS = {"template", "objective", "max_new_tokens", "max_length", "answer_stop", "fill_batches"}
_COMPLETION_OPTIONS = {"max_length", "max_new_tokens", "fill_batches"}
