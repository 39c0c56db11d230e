"""What a run is built from: the data, the task and the model, checked before any training.

:func:`build` loads the data first (cheap failures come before the model loads), then the tokenizer,
the task and the model. :func:`build_together` does the same on every rank of a data-parallel run and
stops them together on bad input. Also here: the micro-batches of a step (:func:`step_batches`), the
dev/test evaluation and the trainable weights' save/load helpers, which the training loop, the
data-parallel ranks, ``paczero eval`` and ``paczero audit`` share.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paczero.checkpoint import CheckpointError
from paczero.config import ConfigError, TrainConfig


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available")
    return device


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


def build(cfg: TrainConfig, *, with_model: bool = True, examples: tuple[list, list, list] | None = None) -> Setup:
    """Load data (first: cheap failures come before the model loads), then the model. ``examples``:
    (train, dev, test) given instead of the config's data (``paczero eval --data`` leaves train empty)."""
    from paczero.models import check_model_source, load_model, load_tokenizer
    from paczero.tasks import build_task, load_splits

    device = resolve_device(cfg.device)
    check_model_source(cfg.model)
    if examples is not None:
        train_ex, dev_ex, test_ex = examples
    else:
        train_ex, dev_ex, test_ex = load_splits(cfg.task, source=cfg.data, n_train=cfg.n_train, n_dev=cfg.n_dev,
                                                n_test=cfg.n_test, seed=cfg.data_seed, columns=cfg.columns)
    if examples is None and len(train_ex) < 2:
        raise ConfigError(f"the training universe needs at least 2 examples, got {len(train_ex)}")
    tokenizer = load_tokenizer(cfg.model)  # the prompts are built and checked (labels, template) before the model
    task = build_task(cfg.task, tokenizer, template=cfg.template, verbalizer=cfg.verbalizer,
                      objective=cfg.objective, max_new_tokens=cfg.max_new_tokens)
    encoded = [task.encode(train_ex), task.encode(dev_ex), task.encode(test_ex)]
    model = None
    if with_model:
        model = load_model(cfg.model, dtype=cfg.dtype, device=device, track=cfg.track, lora_r=cfg.lora_r,
                           lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets, init_seed=cfg.seed,
                           device_map=cfg.device_map, tokenizer=tokenizer).model
        if cfg.device_map:  # inputs go where the embeddings live
            device = str(model.get_input_embeddings().weight.device)
    return Setup(cfg, device, model, tokenizer, task, train_ex, dev_ex, test_ex, *encoded)


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


def build_together(cfg: TrainConfig, dp, resumed_run: dict | None = None) -> tuple[Setup, str]:
    """:func:`build` on every rank, and the data's fingerprint. The ranks stop together (``dp.agree``)
    when one of them fails on bad input, when their examples or tokens differ, or when the data differ
    from those of the run being resumed (``resumed_run``: its run.json, on rank 0)."""
    setup, value, problem = None, None, None
    try:
        setup = build(cfg)
        value = {"examples": data_fingerprint(setup), "tokens": tokens_fingerprint(setup)}
        recorded = None if resumed_run is None else resumed_run.get("data_fingerprint")
        if recorded is not None and recorded != value["examples"]:
            raise ConfigError("cannot resume: the data (universe, dev or test examples) differ from the original run")
    except ValueError as e:
        problem = e
    dp.agree("data", value, problem)
    return setup, value["examples"]


def step_batches(task, universe: list, full_batches: list, idx, token_budget: int) -> tuple[list, int]:
    """The micro-batches a step scores and their row count: the prebuilt ones for the whole
    universe (``idx is None``), else those of the mechanism's subsample (possibly empty)."""
    if idx is None:
        return full_batches, len(universe)
    subset = [universe[i] for i in idx]
    batches = task.make_batches(subset, token_budget=token_budget) if subset else []
    return batches, len(subset)


def evaluate(setup: Setup, enc: list) -> dict[str, float]:
    with torch.inference_mode():
        return {k: float(v) for k, v in setup.task.evaluate(setup.model, enc, token_budget=setup.cfg.token_budget).items()}


def trainable_state(params) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params}


def load_trainable(params, weights: dict[str, torch.Tensor]) -> None:
    missing = [n for n, _ in params if n not in weights]
    if missing:
        raise CheckpointError(f"checkpoint lacks trainable weight {missing[0]!r} (different model or track?)")
    with torch.no_grad():
        for name, p in params:
            p.data.copy_(weights[name].to(device=p.device, dtype=p.dtype))
