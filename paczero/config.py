"""One validated configuration object for a training run.

The CLI merges defaults, a YAML recipe or config file and command-line flags
(in that order of precedence, flags last) into a :class:`TrainConfig`; the
Python API builds the same object directly. :meth:`TrainConfig.validate`
checks everything that can be checked before a model loads and raises
:class:`ConfigError` (a ``ValueError``) with one clear line.
"""
from __future__ import annotations

import dataclasses
import math
import os
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The mechanism registry: every name a config may give (the classes: ``paczero.mechanisms.MECHANISMS``,
#: kept equal to this by a test), and the families that train, report, statement and bench read.
MECHANISMS = ("pac-zpl", "pac-mi", "hybrid", "mezo", "dpzero", "dp-aggzo", "dpzero-aggzo1",
              "raw_full", "quant_full", "raw_half", "quant_half", "random_sign")
PAC_MECHANISMS = ("pac-zpl", "pac-mi", "hybrid", "raw_half", "quant_half")  # these use the candidate subsets
PAC_PRIVATE = ("pac-zpl", "pac-mi", "hybrid")  # a PAC Privacy guarantee
MI_BUDGETED = ("pac-mi", "hybrid")              # take an MI budget (mi_budget)
DP_MECHANISMS = ("dpzero", "dp-aggzo", "dpzero-aggzo1")  # (epsilon, delta)-DP on Poisson-sampled batches
SELECT_METRICS = ("loss", "accuracy", "f1")  # dev-best selection: the lowest dev loss, the highest accuracy or F1
TASKS = ("sst2", "squad", "demo", "completion")
CLASSIFICATION_TASKS = ("sst2", "demo")
LR_SCHEDULES = ("constant", "linear", "polynomial")
ANSWER_STOPS = ("newline-token", "any-newline")  # squad: where a generated answer ends (paczero/tasks/qa.py)
REPORT_TO = ("none", "tensorboard", "wandb")  # live monitoring of a run's public values (paczero/trackers.py)


class ConfigError(ValueError):
    """A configuration that cannot run; the message is one line for the user."""


#: keys of earlier versions that no longer mean anything (ignored when a saved config is read)
_RETIRED = frozenset({"paired_passes"})  # the doubled-batch ± forward, superseded by lockstep_batches


@dataclass
class TrainConfig:
    # model
    model: str = "smollm2-135m-instruct"    # hub id, local folder, or built in: smollm2-135m-instruct (offline), tiny-opt, tiny-llama, tiny-gpt2
    track: str = "lora"                      # "lora" | "ft"
    dtype: str = "fp32"                      # "fp32" | "bf16" | "fp16"
    device: str = "auto"                     # "auto" | "cpu" | "cuda" | "cuda:N"
    device_map: str | None = None            # e.g. "auto": shard a model too big for one GPU (needs accelerate)
    lora_r: int = 8                          # LoRA rank r
    lora_alpha: int = 16                     # LoRA scaling alpha
    lora_targets: list[str] | None = None    # modules that get adapters, e.g. q_proj,v_proj; None: peft's default (query/value projections)
    # task and data
    task: str = "demo"                       # "sst2" | "squad" | "demo" | "completion" (prompt -> completion, or chat messages)
    data: str | None = None                  # a local .jsonl/.json/.csv/.tsv/.parquet file, or "demo"; None: the task's dataset (SST-2, SQuAD: the hub's)
    columns: dict[str, str] | None = None    # map task fields to file columns, e.g. {"sentence": "text"}
    template: str | None = None              # classification prompt, with {sentence}
    verbalizer: dict[int, str] | None = None # classification label -> option text
    labels: list[str] | None = None          # classification class names, label i the i-th (e.g. negative,positive): the data may give labels by name; the verbalizer defaults to " name"
    objective: str = "nll"                   # squad training loss: "nll" | "f1"
    n_train: int = 1000                      # |U|, the training universe
    n_dev: int = 500                         # dev examples (model selection), drawn apart from U
    n_test: int | None = None                # None: the task's protocol (all of SST-2 validation, 1000 for SQuAD)
    data_seed: int = 0                       # which examples are drawn for U, dev and test
    # mechanism
    mechanism: str = "pac-zpl"               # what releases each step's bit or value
    num_subsets: int = 128                   # M
    mi_budget: float | None = None           # total MI in nats (pac-mi, hybrid)
    schedule: str = "adaptive"               # pac-mi allocation: "adaptive" | "uniform"
    switch_step: int | None = None           # hybrid: PAC-MI until this step, then the zero-MI tail
    noised_coef: str = "bit"                 # PAC-MI/hybrid noised releases move theta by: "bit" (the paper: the released sign) | "posterior-mean" (the posterior mean of s_j* after it; post-processing, MI unchanged)
    coin_step: str = "move"                  # PAC mechanisms' coin releases: "move" (the paper: theta moves along the coin) | "skip" (theta stays, no coin drawn; MI unchanged)
    epsilon: float | None = None             # DP baselines: target epsilon
    delta: float = 1e-5                      # DP baselines: delta
    dp_clip: float = 25.0                    # DP baselines: per-example clip of the scalar
    sample_rate: float = 0.064               # DP baselines: Poisson sampling rate q
    accountant: str = "rdp"                  # "rdp" | "pld" (the other is reported too)
    batch_size: int | None = None            # mezo mini-batch (None: the whole universe)
    # optimisation
    steps: int = 1000                        # T
    lr: float = 1e-3                         # learning rate
    lr_schedule: str = "constant"            # learning-rate schedule
    weight_decay: float = 0.0                # decoupled weight decay per step
    mu: float = 1e-3                         # perturbation scale of the two-point difference
    clip: float | None = None                # stability clip c (None: off)
    num_directions: int = 1                  # K
    # evaluation and selection
    eval_every: int = 100                    # steps between dev evaluations
    dev_best: bool = True                    # release the dev-best weights (post-processing) instead of the last
    select_metric: str | None = None         # what dev-best selects by: "loss" (lowest) | "accuracy" | "f1" (highest); None: the task's metric
    eval_zero_shot: bool = True              # evaluate the base model on dev and test first
    rungs: list[int] | None = None           # T-ladder: steps at which one run saves and evaluates its weights
    ood_data: str | None = None              # a second labelled file (same columns), evaluated whole at the end (and zero-shot): the out-of-domain test (summary.json ood_test)
    heldout_attack: bool = False             # after training, the loss attack on the released model: U's records against the held-out test records (summary.json heldout_attack: AUC with a bootstrap interval)
    # engineering
    token_budget: int = 4096                 # tokens per micro-batch (rows x padded length)
    lockstep_batches: int = 1                # full FT: token budgets per sign whose + and - forwards share each draw of z (0: off)
    compile: bool = False                    # torch.compile the model body (LoRA, classification tasks)
    seed: int = 0                            # public seed: directions, init, data order
    private_seed: int | None = None          # tests and exact reproduction only; None draws from OS entropy
    out_dir: str = "runs/paczero"            # the run folder (never overwritten without --overwrite)
    overwrite: bool = False                  # replace an earlier paczero run in out_dir
    resume: bool = False                     # continue the run in out_dir from its newest checkpoint
    checkpoint_every: int = 50               # steps between checkpoints
    progress: bool = True                    # a progress bar on stderr
    push_to_hub: str | None = None           # after the run, upload the released model to this hub repository id (created if need be)
    hub_private: bool = False                # push_to_hub: create the repository private
    report_to: str = "none"                  # live monitoring of the public per-step values: "none" | "tensorboard" | "wandb" (their own libraries: pip install 'paczero[tensorboard]' or 'paczero[wandb]')
    max_new_tokens: int = 50                 # squad: the longest generated answer
    max_length: int = 2048                   # tokens per example (squad: prompt plus generated answer); longer prompts lose tokens from the left, with a warning
    answer_stop: str = "newline-token"       # squad generation: "newline-token" (the newline token or EOS) | "any-newline"

    # ------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> "TrainConfig":
        values = {k: v for k, v in values.items() if k not in _RETIRED}
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}")
        if isinstance(values.get("lora_targets"), str):  # "q_proj,v_proj", as the flag takes it
            values["lora_targets"] = [t.strip() for t in values["lora_targets"].split(",")]
        if isinstance(values.get("labels"), str):  # "negative,positive", as the flag takes it
            values["labels"] = [t.strip() for t in values["labels"].split(",")]
        return cls(**{k: _as_number(cls, k, v) for k, v in values.items()})

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> "TrainConfig":
        values = load_yaml(path)
        values.update(overrides or {})
        return cls.from_dict(values, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------
    def validate(self) -> "TrainConfig":
        """Check the configuration; return self. Raises ConfigError with one line."""
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        def finite_pos(name: str, v: Any, allow_zero: bool = False) -> None:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
            need(ok, f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {v!r}")

        def integer(name: str, v: Any, lo: int) -> None:
            need(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{name} must be an integer >= {lo}, got {v!r}")

        need(isinstance(self.model, str) and self.model.strip() != "", "model must be a non-empty name or path")
        need(self.track in ("lora", "ft"), f"track must be 'lora' or 'ft', got {self.track!r}")
        need(self.device_map in (None, "auto", "balanced", "balanced_low_0", "sequential"),
             f"device_map must be auto, balanced, balanced_low_0 or sequential, got {self.device_map!r}")
        need(self.dtype in ("fp32", "bf16", "fp16"), f"dtype must be fp32, bf16 or fp16, got {self.dtype!r}")
        need(self.device == "auto" or self.device == "cpu" or str(self.device).startswith("cuda"),
             f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        integer("lora_r", self.lora_r, 1)
        finite_pos("lora_alpha", self.lora_alpha)
        need(self.task in TASKS, f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        need(self.objective in ("nll", "f1"), f"objective must be 'nll' or 'f1', got {self.objective!r}")
        integer("n_train", self.n_train, 2)
        integer("n_dev", self.n_dev, 1)
        if self.n_test is not None:
            integer("n_test", self.n_test, 1)
        need(self.mechanism in MECHANISMS, f"unknown mechanism {self.mechanism!r}; choose one of {', '.join(MECHANISMS)}")
        integer("num_subsets", self.num_subsets, 2)
        need(self.num_subsets % 2 == 0, f"num_subsets (M) must be even, got {self.num_subsets}")
        integer("steps", self.steps, 1)
        finite_pos("lr", self.lr)
        need(self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        finite_pos("weight_decay", self.weight_decay, allow_zero=True)
        finite_pos("mu", self.mu)
        if self.clip is not None:
            finite_pos("clip", self.clip)
        integer("num_directions", self.num_directions, 1)
        integer("eval_every", self.eval_every, 1)
        if self.select_metric is not None:
            need(self.select_metric in SELECT_METRICS,
                 f"select_metric must be one of {', '.join(SELECT_METRICS)}, got {self.select_metric!r}")
            need(self.select_metric != ("accuracy" if self.task in ("squad", "completion") else "f1"),
                 f"select_metric {self.select_metric} does not apply to task {self.task} (its dev metrics: "
                 f"{'loss, f1' if self.task in ('squad', 'completion') else 'loss, accuracy'})")
        integer("token_budget", self.token_budget, 16)
        integer("lockstep_batches", self.lockstep_batches, 0)
        if self.compile:
            need(self.track == "lora", "compile applies to --track lora only (full fine-tuning reroutes module "
                                       "forwards inside each evaluation, which a compiled graph would not see)")
            need(self.task in CLASSIFICATION_TASKS, "compile applies to classification tasks only (SQuAD decodes answers "
                                       "with a key-value cache, which is not compiled here)")
            need(self.device_map is None, "compile does not apply to a sharded model (--device-map)")
        integer("checkpoint_every", self.checkpoint_every, 1)
        need(self.report_to in REPORT_TO, f"report_to must be one of {', '.join(REPORT_TO)}, got {self.report_to!r}")
        if self.push_to_hub is not None:
            from huggingface_hub.errors import HFValidationError
            from huggingface_hub.utils import validate_repo_id

            try:
                validate_repo_id(self.push_to_hub)
            except HFValidationError as e:
                raise ConfigError(f"push_to_hub {self.push_to_hub!r}: {str(e).splitlines()[0]}") from None
        need(not (self.overwrite and self.resume), "give --overwrite (replace the run in out_dir) or --resume "
                                                   "(continue it), not both")
        if self.lora_targets is not None:
            need(isinstance(self.lora_targets, list) and len(self.lora_targets) > 0
                 and all(isinstance(t, str) and t.strip() and "," not in t for t in self.lora_targets),
                 f"lora_targets must be a list of module names, e.g. q_proj,v_proj, got {self.lora_targets!r}")
        integer("max_new_tokens", self.max_new_tokens, 1)
        integer("max_length", self.max_length, 2)
        need(self.task != "squad" or self.max_length > self.max_new_tokens,
             f"max_length ({self.max_length}) must exceed max_new_tokens ({self.max_new_tokens})")
        need(self.answer_stop in ANSWER_STOPS,
             f"answer_stop must be one of {', '.join(ANSWER_STOPS)}, got {self.answer_stop!r}")
        if self.rungs is not None:
            need(isinstance(self.rungs, list) and len(self.rungs) > 0
                 and all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in self.rungs),
                 f"rungs must be a non-empty list of steps >= 1, e.g. [500, 1000, 1500], got {self.rungs!r}")
            need(all(a < b for a, b in zip(self.rungs, self.rungs[1:])),
                 f"rungs must be increasing, got {self.rungs}")
            need(self.rungs[-1] <= self.steps, f"rung {self.rungs[-1]} lies beyond steps ({self.steps}); "
                                               f"a ladder runs to its last rung (steps {self.rungs[-1]})")
        integer("seed", self.seed, 0)
        if self.private_seed is not None:
            integer("private_seed", self.private_seed, 0)
        if self.mechanism in MI_BUDGETED:
            need(self.mi_budget is not None, f"{self.mechanism} needs mi_budget (total MI in nats), e.g. --mi-budget 0.33")
            finite_pos("mi_budget", self.mi_budget)
        elif self.mi_budget is not None:
            raise ConfigError(f"mi_budget applies to pac-mi and hybrid only, not {self.mechanism}")
        need(self.schedule in ("adaptive", "uniform"), f"schedule must be 'adaptive' or 'uniform', got {self.schedule!r}")
        need(self.coin_step in ("move", "skip"), f"coin_step must be 'move' or 'skip', got {self.coin_step!r}")
        need(self.noised_coef in ("bit", "posterior-mean"),
             f"noised_coef must be 'bit' or 'posterior-mean', got {self.noised_coef!r}")
        if self.noised_coef != "bit":
            need(self.mechanism in ("pac-mi", "hybrid"),
                 f"noised_coef applies to pac-mi and hybrid only, not {self.mechanism}")
        if self.coin_step != "move":
            need(self.mechanism in ("pac-zpl", "pac-mi", "hybrid"),
                 f"coin_step applies to pac-zpl, pac-mi and hybrid only, not {self.mechanism}")
        if self.mechanism == "hybrid":
            need(self.switch_step is not None, "hybrid needs switch_step")
            integer("switch_step", self.switch_step, 0)
        if self.mechanism in DP_MECHANISMS:
            need(self.epsilon is not None, f"{self.mechanism} needs epsilon, e.g. --epsilon 2")
            finite_pos("epsilon", self.epsilon)
            need(isinstance(self.delta, float) and 0 < self.delta < 1, f"delta must be in (0, 1), got {self.delta!r}")
            finite_pos("dp_clip", self.dp_clip)
            need(isinstance(self.sample_rate, (int, float)) and 0 < self.sample_rate <= 1,
                 f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
            need(self.accountant in ("rdp", "pld"), f"accountant must be 'rdp' or 'pld', got {self.accountant!r}")
            if self.mechanism in ("dpzero", "dpzero-aggzo1"):
                need(self.num_directions == 1, f"{self.mechanism} uses one direction per step (num_directions 1); "
                                               "use dp-aggzo for K > 1")
        elif self.epsilon is not None:
            raise ConfigError(f"epsilon applies to {', '.join(DP_MECHANISMS)} only, not {self.mechanism}")
        if self.batch_size is not None:
            need(self.mechanism == "mezo", "batch_size applies to mezo only")
            integer("batch_size", self.batch_size, 1)
        if self.labels is not None:
            need(self.task in CLASSIFICATION_TASKS,
                 f"labels apply to the classification tasks ({', '.join(CLASSIFICATION_TASKS)}), not {self.task}")
            need(isinstance(self.labels, list) and len(self.labels) >= 2
                 and all(isinstance(n, str) and n.strip() and "," not in n for n in self.labels)
                 and len({n.strip() for n in self.labels}) == len(self.labels),
                 f"labels must be two or more distinct class names, e.g. negative,positive, got {self.labels!r}")
            need(self.verbalizer is None or set(self.verbalizer) == set(range(len(self.labels))),
                 f"verbalizer labels {sorted(self.verbalizer or {})} must be the positions 0..{len(self.labels) - 1} "
                 f"of the {len(self.labels)} label names")
        if self.verbalizer is not None:
            need(isinstance(self.verbalizer, dict) and len(self.verbalizer) >= 2
                 and all(isinstance(v, str) and v for v in self.verbalizer.values()),
                 "verbalizer must map at least two labels to non-empty strings")
        if self.template is not None:
            need(self.task != "completion", "template does not apply to task completion: its prompts are the "
                                            "data's prompt column (or its messages)")
            allowed = ("title", "context", "question") if self.task == "squad" else ("sentence",)
            try:
                names = [name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None]
            except ValueError as e:
                raise ConfigError(f"template is not a format string ({e}); write literal braces as {{{{ and }}}}") from None
            bad = next((name for name in names if name not in allowed), None)
            need(bad is None, f"template may use {' '.join('{' + a + '}' for a in allowed)} only, not {{{bad}}}")
            if self.task != "squad":
                need("sentence" in names, "template must contain {sentence}")
        if self.data is not None and self.data != "demo":
            p = Path(self.data).expanduser()
            need(p.is_file(), f"data file {self.data!r} does not exist" if not p.exists() else
                 f"data {self.data!r} is not a file")
            need(os.access(p, os.R_OK), f"data file {self.data!r} is not readable")
        return self


def _as_number(cls, key: str, value: Any) -> Any:
    """A number written as text where the field holds a float: YAML 1.1 (PyYAML) reads ``5e-4`` and
    ``1e-05`` as strings, as every Hugging Face config writes them. Other values are left to validate()."""
    import typing

    if not isinstance(value, str):
        return value
    hint = typing.get_type_hints(cls).get(key)
    if float in (typing.get_args(hint) or (hint,)):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if p.is_dir():
        hint = (f"to continue the run in it: --resume --out-dir {str(path)!r}" if (p / "run.json").exists()
                else "e.g. a recipe saved with paczero recipes --show NAME > my.yaml")
        raise ConfigError(f"config file {str(path)!r} is a folder; give a YAML file of config keys ({hint})")
    try:
        values = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {e.strerror or e.__class__.__name__}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values")
    values = dict(values)
    values.pop("recipe", None)  # descriptive block of shipped recipes
    values.pop("paper", None)
    if isinstance(values.get("verbalizer"), dict):
        values["verbalizer"] = {int(k): v for k, v in values["verbalizer"].items()}
    return values
