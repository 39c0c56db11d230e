"""The Python API: fine-tune a model object, a tokenizer object and examples in memory.

::

    from paczero import PACZeroTrainer

    trainer = PACZeroTrainer(model=model, tokenizer=tokenizer, train_dataset=dataset, task="sst2",
                             mechanism="pac-mi", mi_budget=0.33, n_train=1000, n_dev=500, out_dir="runs/mine")
    result = trainer.train()
    result.model        # the trained model (the released weights: dev-best unless dev_best is off)
    result.statement    # the privacy statement in words; result.privacy holds its numbers

:meth:`PACZeroTrainer.train` runs :func:`paczero.train.train`, the loop of ``paczero train``, with the
objects in place of what the config would load: the same run folder (checkpoints, journal, log, dev-best,
summary, model card), the same checks, the same privacy statement. The model is trained in place: a
transformers causal LM (full fine-tuning, ``track="ft"``; or, on ``track="lora"``, wrapped with peft LoRA
adapters as ``paczero train`` wraps a loaded model) or a peft model with LoRA adapters (trained as they
are). The examples, a ``datasets.Dataset``, a pandas DataFrame or a list of dicts, are read as a data file
with the same rows is read (``columns``, a ``split`` column, ``n_train``/``n_dev``/``n_test`` sampling).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paczero.run.build import Given
from paczero.config import DP_MECHANISMS, ConfigError, TrainConfig

#: what ``eval_dataset`` and ``test_dataset`` rows become: rows of a data file's ``split`` column
_SPLITS = (("train_dataset", "train"), ("eval_dataset", "validation"), ("test_dataset", "test"))


@dataclass
class TrainResult:
    """What :meth:`PACZeroTrainer.train` returns."""
    model: Any          # the trained model, holding the released weights (the peft wrapper on track lora)
    summary: dict       # summary.json's content; {"stopped_at", "out_dir", "privacy"} for a run stopped early
    run_dir: Path       # the run folder: checkpoints, log, journal, summary, model/ with its card
    config: TrainConfig  # the configuration the run recorded (model: the object's name_or_path)

    @property
    def stopped(self) -> bool:
        """Whether the run stopped before its last step (SIGTERM, Ctrl-C); ``train(resume=True)`` continues it."""
        return "stopped_at" in self.summary

    @property
    def privacy(self) -> dict:
        """The privacy statement's numbers (``mi_bound``, ``mia_bound``, ...); for a stopped run, those of
        the steps it ran (its weights are post-processing of their releases)."""
        return self.summary.get("privacy") or {}

    @property
    def statement(self) -> str:
        """The privacy statement in words, as the model card states it; for a stopped run, how to go on."""
        if self.stopped:
            return (f"The run in {self.summary['out_dir']} stopped at step {self.summary['stopped_at']} of "
                    f"{self.config.steps}, before its test evaluation and release (no model card, no privacy "
                    f"statement yet): {RESUME_WORDS}.")
        return self.summary.get("privacy_text") or ""


#: how a stopped run goes on, in this API's words
RESUME_WORDS = ("trainer.train(resume=True) continues it (the same trainer, or a PACZeroTrainer given the same "
                "objects and out_dir)")


class PACZeroTrainer:
    """One paczero run on objects in memory. ``config``: a :class:`TrainConfig` or a dict of its keys;
    keyword ``settings`` (``mechanism=``, ``mi_budget=``, ``steps=``, ``out_dir=``, ...) and ``task``
    override it. Any of ``model``, ``tokenizer`` and ``train_dataset`` left out is loaded as the config
    names it (``model``, ``data``). The datasets are used as given, as transformers' and TRL's trainers use
    theirs: every row of ``train_dataset`` is the universe U, every row of ``eval_dataset`` the dev set (model
    selection) and every row of ``test_dataset`` the test set; ``n_train``, ``n_dev`` or ``n_test``, when set,
    draw that many (seeded). With no ``test_dataset`` the final evaluation is on ``eval_dataset``; with
    ``train_dataset`` alone, a fifth of its rows is drawn for test and a fifth of the rest for dev. One log
    line and run.json (``data_use``) say what was used for what."""

    def __init__(self, model: Any = None, tokenizer: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, test_dataset: Any = None, *, task: str | None = None,
                 config: TrainConfig | Mapping | None = None, **settings: Any):
        if config is None:
            config = TrainConfig()
        elif isinstance(config, Mapping):
            config = TrainConfig.from_dict(dict(config), source="config")
        elif not isinstance(config, TrainConfig):
            raise ConfigError(f"config must be a TrainConfig or a dict of its keys, got {type(config).__name__}")
        if task is not None:
            settings["task"] = task
        unknown = sorted(set(settings) - set(TrainConfig.field_names()))
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; the keys of TrainConfig are the settings")
        self.config = config.replace(**settings)
        defaults = TrainConfig()
        #: the sample sizes the caller set (the others: every row given)
        self._sizes = {k for k in ("n_train", "n_dev", "n_test")
                       if k in settings or getattr(config, k) != getattr(defaults, k)}
        self.model, self.tokenizer = model, tokenizer
        self.datasets = {"train_dataset": train_dataset, "eval_dataset": eval_dataset, "test_dataset": test_dataset}
        if model is not None:
            _check_model(model, self.config.track)
        if tokenizer is not None:
            _check_tokenizer(tokenizer)

    def train(self, *, resume: bool | None = None, log=print) -> TrainResult:
        """Train (``resume=True``: continue the run in ``out_dir`` from its newest checkpoint, given the
        same objects or the model an earlier call returned); return the trained model and the summary. Bad
        input raises ConfigError (a ValueError) in one line, in the words of this API."""
        try:
            return self._train(resume, log)
        except ValueError as e:  # the messages name `paczero train`'s flags: here the keyword arguments
            e.args = (in_api_words(str(e)),) + e.args[1:]
            raise

    def _train(self, resume: bool | None, log) -> TrainResult:
        from paczero.run.release import check_push_possible, push_finished_run
        from paczero.train import train

        cfg = self.config if resume is None else self.config.replace(resume=resume)
        if self.model is not None:
            cfg = _describe(cfg, self.model, self.tokenizer)
        cfg = cfg.validate()
        _check_dp_sizes(cfg, self.datasets, self._sizes)
        examples = _examples(cfg, self.datasets, self._sizes)
        if examples is not None:  # the sizes used, as run.json, the statement, the card and the summary state them
            used = dict(zip(("n_train", "n_dev", "n_test"), map(len, examples)))
            if cfg.mechanism in DP_MECHANISMS:  # U's size is private: the public n_train stays its expected size
                used.pop("n_train")
            cfg = cfg.replace(**used)
        elif len(self._sizes) < 3:  # a data file too small for the default sizes is used as given, as on the command line
            from paczero.flags import sizes_as_given

            cfg = sizes_as_given(cfg, say=lambda line: log(in_api_words(line)), given=self._sizes)
        note = _data_use(self.datasets, examples, cfg.n_train if cfg.mechanism in DP_MECHANISMS else None)
        if note:
            log(f"paczero: data: {note}")
        given = Given(model=self.model, tokenizer=self.tokenizer, examples=examples, data_use=note)
        if given.names():
            _single_process()
        check_push_possible(cfg)
        summary = train(cfg, log=lambda line: log(in_api_words(line)), given=given)
        if cfg.push_to_hub is not None and "stopped_at" not in summary:
            push_finished_run(cfg, log=log)
        if self.model is not None:  # a later call (resume) goes on with the model this one trained
            self.model = given.prepared
        return TrainResult(model=given.prepared, summary=summary, run_dir=Path(cfg.out_dir).expanduser(),
                           config=cfg)


#: `paczero train`'s words in a message, and this API's (the first match of each place wins)
_API_WORDS = [
    (r"--columns [\w=,]+ \(Python: (columns=\{[^}]*\})\)", r"\1"),
    (r"--labels \(e\.g\. --labels ([\w-]+(?:,[\w-]+)*)\)",
     lambda m: "labels=[...] (e.g. labels=" + repr(m.group(1).split(",")) + ")"),
    (r"continue with --resume", RESUME_WORDS),
    (r"--resume --out-dir ('[^']*'|\S+)", r"resume=True with out_dir=\1"),
    (r"--out-dir (\S+)", r"out_dir=\1"),
    (r"--overwrite\b", "overwrite=True"),
    (r"--resume\b", "resume=True"),
    (r"--data (PATH|FILE)\b", r"data=\1 (or train_dataset=...)"),
    (r"--labels\b", "labels=[...]"),
    (r"--columns\b", "columns={...}"),
    (r"--verbalizer \(e\.g\. ((?:\d+=[^,)]*,?)+)\)",
     lambda m: "verbalizer={...} (e.g. verbalizer=" + repr({int(k): v for k, v in
                                                          (p.split("=", 1) for p in m.group(1).split(","))}) + ")"),
    (r"--verbalizer\b", "verbalizer={...}"),
    (r"--template auto\b", "template='auto'"),
    (r"--n-(train|dev|test)\b", r"n_\1"),
]


def in_api_words(message: str) -> str:
    """``message`` with the command line's flags (``--overwrite``, ``--labels a,b``, ...) in this API's
    keyword arguments (``overwrite=True``, ``labels=['a', 'b']``, ...)."""
    import re

    for pattern, words in _API_WORDS:
        message = re.sub(pattern, words, message)
    return message


# -- the model object --------------------------------------------------------------------------------
def _check_model(model: Any, track: str) -> None:
    """One line on a model object that cannot train here: not a causal LM, or not on this track."""
    from transformers import PreTrainedModel

    from paczero.models import hf_model, is_peft

    base = hf_model(model) if is_peft(model) else model
    if not isinstance(base, PreTrainedModel) or base.get_output_embeddings() is None:
        hint = "; a model name or path goes in the config's model setting" if isinstance(model, (str, Path)) else ""
        raise ConfigError(f"model must be a causal language model object (a transformers ...ForCausalLM, or a "
                          f"peft model of one), got {type(model).__name__}{hint}")
    if is_peft(model):
        kind = str(getattr(model.peft_config.get(model.active_adapter), "peft_type", ""))
        if "LORA" not in kind.upper():
            raise ConfigError(f"a peft model given as model must hold LoRA adapters, got {kind or 'other'} adapters")
        if track != "lora":
            raise ConfigError("a peft model trains its LoRA adapters (track lora); for full fine-tuning give the "
                              "model without adapters")
    elif any("lora_" in name for name, _ in model.named_parameters()):
        raise ConfigError("model holds LoRA layers but is no peft model (peft wrapped it in an earlier run): give "
                          "the peft model that wraps it (an earlier result's model) or a fresh model")
    if track == "ft" and any(not p.is_floating_point() for p in model.parameters()):
        raise ConfigError("full fine-tuning perturbs every weight and this model holds quantised (integer) "
                          "weights; train LoRA adapters (track lora)")


def _check_tokenizer(tokenizer: Any) -> None:
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ConfigError(f"tokenizer must be a transformers tokenizer object, got {type(tokenizer).__name__}")


def _describe(cfg: TrainConfig, model: Any, tokenizer: Any) -> TrainConfig:
    """The config as run.json and the model card record it for a model object: ``model`` its
    ``name_or_path`` (else its class name), ``dtype`` its own, LoRA settings those of its adapters (a peft
    model) or the modules peft's default adapts (so that a resume with the peft model a run returned
    matches the run it continues), ``device`` the GPU it is on (``auto``)."""
    import torch

    from paczero.models import hf_model, is_peft

    _check_model(model, cfg.track)
    base = hf_model(model) if is_peft(model) else model
    name = getattr(base, "name_or_path", None) or getattr(base.config, "_name_or_path", None) or type(base).__name__
    if tokenizer is None and name == type(base).__name__:
        raise ConfigError(f"a model built in memory ({name}) needs its tokenizer: give tokenizer=...")
    dtypes = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    if base.dtype not in dtypes:
        raise ConfigError(f"the model's dtype {base.dtype} is not one paczero trains in (float32, bfloat16, float16)")
    changes: dict[str, Any] = {"model": str(name), "dtype": dtypes[base.dtype], "device_map": None}
    if cfg.device == "auto" and base.device.type == "cuda":
        changes["device"] = str(base.device)
    if is_peft(model):
        lora = model.peft_config[model.active_adapter]
        targets = lora.target_modules
        changes.update(lora_r=int(lora.r), lora_alpha=lora.lora_alpha,
                       lora_targets=[targets] if isinstance(targets, str) else sorted(targets))
    elif cfg.track == "lora" and cfg.lora_targets is None:
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULT_TARGETS

        kind = getattr(base.config, "model_type", None)
        if kind not in DEFAULT_TARGETS:
            raise ConfigError(f"peft names no default LoRA target modules for model type {kind!r}: set "
                              "lora_targets, e.g. lora_targets=['q_proj', 'v_proj']")
        changes["lora_targets"] = sorted(DEFAULT_TARGETS[kind])
    return cfg.replace(**changes)


# -- the examples --------------------------------------------------------------------------------------
def _examples(cfg: TrainConfig, datasets: dict[str, Any],
              sizes: set[str] | frozenset = frozenset({"n_train", "n_dev", "n_test"})) -> tuple[list, list, list] | None:
    """(train, dev, test) examples of the datasets given, normalised as a data file with the same rows; None
    when none is given. ``sizes``: the sample sizes of ``cfg`` the caller set; every other split takes every
    row given (train_dataset alone: a fifth for test, a fifth of the rest for dev, unless set)."""
    from paczero.tasks.data import canonical_rows, canonical_task, class_labels
    from paczero.tasks.split import split_records, stable_split

    if datasets["train_dataset"] is None:
        if any(v is not None for v in datasets.values()):
            raise ConfigError("eval_dataset and test_dataset go with a train_dataset")
        return None
    if cfg.data is not None:
        raise ConfigError(f"give the examples as train_dataset or as the config's data ({cfg.data!r}), not both")
    given = {name: _rows(datasets[name], name) for name, _ in _SPLITS if datasets[name] is not None}
    n = {k: (getattr(cfg, k) if k in sizes else None) for k in ("n_train", "n_dev", "n_test")}
    if len(given) == 1:
        records, where = given["train_dataset"], "train_dataset"
        if records and "split" not in records[0] and n["n_train"] is None and n["n_dev"] is None:
            rest = len(records) - (n["n_test"] if n["n_test"] is not None else max(1, round(0.2 * len(records))))
            n["n_dev"] = max(1, round(0.2 * rest))
    else:
        if any("split" in rows[0] for rows in given.values() if rows):
            raise ConfigError("a dataset with a split column goes alone, as train_dataset (it assigns its rows "
                              "to splits); give eval_dataset and test_dataset without one")
        if "eval_dataset" not in given:
            raise ConfigError("a test_dataset goes with an eval_dataset (the dev set that selects the released "
                              "weights); give eval_dataset=... too")
        test = given.get("test_dataset", given["eval_dataset"])  # no test set given: the dev set is evaluated last
        records = ([{**row, "split": "train"} for row in given["train_dataset"]]
                   + [{**row, "split": "validation"} for row in given["eval_dataset"]]
                   + [{**row, "split": "test"} for row in test])
        where = " + ".join(given)
    task, classes = canonical_task(cfg.task), class_labels(cfg.task, cfg.verbalizer, cfg.labels)
    try:
        for name, rows in given.items():  # each dataset checked apart: a message names its own row
            canonical_rows(task, rows, name, cfg.columns or {}, cfg.labels, classes)
        if cfg.mechanism in DP_MECHANISMS:  # each row's split from that row alone (paczero/tasks/split.py)
            return stable_split(task, records, where, n["n_train"], n["n_dev"], n["n_test"], cfg.data_seed,
                                cfg.columns or {}, cfg.labels, classes, cfg.data_fraction)
        return split_records(task, records, where, n["n_train"], n["n_dev"], n["n_test"], cfg.data_seed,
                             cfg.columns or {}, cfg.labels, classes)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_dp_sizes(cfg: TrainConfig, datasets: dict[str, Any], sizes: set[str]) -> None:
    """A DP run takes no sample size from its data (:func:`paczero.flags.check_dp_sizes`): with a
    ``train_dataset``, ``n_train`` is set (else U would be every row, and the run would publish their number),
    and so are ``n_dev`` and ``n_test`` where dev and test are drawn from it (no ``eval_dataset``); a data file
    needs ``n_test`` as on the command line. One line (ConfigError) before any row is read."""
    from paczero.config import DP_MECHANISMS
    from paczero.flags import check_dp_sizes, dp_sizes_error

    if cfg.mechanism not in DP_MECHANISMS:
        return
    if datasets["train_dataset"] is None:
        check_dp_sizes(cfg)
        return
    needed = ("n_train",) if datasets["eval_dataset"] is not None else ("n_train", "n_dev", "n_test")
    if not set(needed) <= set(sizes):
        raise dp_sizes_error(cfg.mechanism, " and ".join(", ".join(needed).rsplit(", ", 1)))


def _data_use(datasets: dict[str, Any], examples: tuple[list, list, list] | None,
              expected: int | None = None) -> str | None:
    """What the run uses each dataset for, in one line (logged, and run.json's ``data_use``). ``expected``: a DP
    run's public n_train, said in place of U's private size."""
    if examples is None:
        return None
    train, dev, test = (len(x) for x in examples)
    train = train if expected is None else f"about {expected} (the stable split's)"
    if datasets["eval_dataset"] is None:
        return (f"U = {train} rows of train_dataset; dev = {dev} and test = {test} other rows of it (drawn with "
                "data_seed; give eval_dataset and test_dataset to choose them)")
    tested = "test_dataset" if datasets["test_dataset"] is not None else \
        "eval_dataset (no test_dataset given: the final evaluation reuses the dev set)"
    return (f"U = {train} rows of train_dataset; dev (selects the released weights) = {dev} rows of eval_dataset; "
            f"test = {test} rows of {tested}")


def _rows(data: Any, name: str) -> list[dict]:
    """The rows of a ``datasets.Dataset``, a pandas DataFrame or an iterable of dicts, as dicts."""
    if hasattr(data, "to_dict") and hasattr(data, "columns") and hasattr(data, "iloc"):  # a pandas DataFrame
        rows = data.to_dict(orient="records")
    elif hasattr(data, "column_names") and hasattr(data, "to_list"):  # a datasets.Dataset
        rows = data.to_list()
    elif isinstance(data, (str, bytes, Path, Mapping)) or not isinstance(data, Iterable):
        hint = " (one split of it, e.g. dataset['train'])" if isinstance(data, Mapping) else \
            "; a data file goes in the config's data setting" if isinstance(data, (str, Path)) else ""
        raise ConfigError(f"{name} must be a datasets.Dataset, a pandas DataFrame or a list of dicts, "
                          f"got {type(data).__name__}{hint}")
    else:
        rows = list(data)
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, Mapping)), None)
    if bad is not None:
        raise ConfigError(f"{name} row {bad + 1}: expected a mapping of column names to values, "
                          f"got {type(rows[bad]).__name__}")
    return [dict(row) for row in rows]


def _single_process() -> None:
    """Objects in memory train in one process: under torchrun each rank would hold its own copy."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else \
        int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        raise ConfigError(f"objects given in memory train in one process, not in a data-parallel world of {world}; "
                          "give the model and data by name and path to `paczero train` under torchrun "
                          "(docs/distributed.md)")
