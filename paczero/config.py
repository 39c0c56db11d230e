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
MECHANISMS = ("pac-zpl", "pac-mi", "hybrid", "mezo", "dpzero", "dp-aggzo", "dpzero-aggzo1", "dp-sgd", "adamw",
              "raw_full", "quant_full", "raw_half", "quant_half", "random_sign")
PAC_MECHANISMS = ("pac-zpl", "pac-mi", "hybrid", "raw_half", "quant_half")  # these use the candidate subsets
PAC_PRIVATE = ("pac-zpl", "pac-mi", "hybrid")  # a PAC Privacy guarantee
MI_BUDGETED = ("pac-mi", "hybrid")              # take an MI budget (mi_budget)
DP_MECHANISMS = ("dpzero", "dp-aggzo", "dpzero-aggzo1", "dp-sgd")  # (epsilon, delta)-DP on Poisson-sampled batches
CANARY_MECHANISMS = ("dp-sgd", "dpzero")  # normalised by the public q * n_train: canaries (config canaries) apply
FIRST_ORDER = ("dp-sgd", "adamw")  # a gradient step (paczero/fo/), not the zeroth-order step
NON_PRIVATE_FIRST_ORDER = "adamw"  # plain AdamW fine-tuning (as Trainer/TRL's SFT): no clipping, no noise, no privacy
SELECT_METRICS = ("loss", "accuracy", "f1")  # dev-best selection: the lowest dev loss, the highest accuracy or F1
TASKS = ("sst2", "classification", "squad", "demo", "completion")
CLASSIFICATION_TASKS = ("sst2", "classification", "demo")  # classification: your labelled file (--data)
AUTO = "auto"  # template auto: the prompt and its answer words chosen zero-shot on dev (paczero/tasks/prompts.py)
LR_SCHEDULES = ("constant", "linear", "polynomial")
ANSWER_STOPS = ("newline-token", "any-newline")  # squad: where a generated answer ends (paczero/tasks/qa.py)
REPORT_TO = ("none", "tensorboard", "wandb")  # live monitoring of a run's public values (paczero/run/trackers.py)


class ConfigError(ValueError):
    """A configuration that cannot run; the message is one line for the user."""


#: keys of earlier versions that no longer mean anything (ignored when a saved config is read)
_RETIRED = frozenset({"paired_passes"})  # the doubled-batch ± forward, superseded by lockstep_batches


@dataclass
class TrainConfig:
    # model
    model: str = "smollm2-135m-instruct"    # hub id, local folder, or built in: smollm2-135m-instruct (offline), tiny-opt, tiny-llama, tiny-gpt2
    track: str = "lora"                      # "lora" | "ft"
    dtype: str = "auto"                      # "auto" (bf16 where the device computes it natively, else fp32) | "fp32" | "bf16" | "fp16"
    device: str = "auto"                     # "auto" | "cpu" | "cuda" | "cuda:N"
    device_map: str | None = None            # e.g. "auto": shard a model too big for one GPU (needs accelerate)
    lora_r: int = 8                          # LoRA rank r
    lora_alpha: int = 16                     # LoRA scaling alpha
    lora_targets: list[str] | None = None    # modules that get adapters, e.g. q_proj,v_proj; None: peft's default (query/value projections)
    # task and data
    task: str = "demo"                       # "classification" (your labelled file: --data) | "sst2" | "squad" | "demo" | "completion" (prompt -> completion, or chat messages)
    data: str | None = None                  # a local .jsonl/.json/.csv/.tsv/.parquet file, or "demo"; None: the task's dataset (SST-2, SQuAD: the hub's)
    dev_data: str | None = None              # a file of its own for dev (read without protection: a public file where dev rows must not be private); every row of data then trains
    test_data: str | None = None             # a file of its own for test (as dev_data); with dev_data alone, dev is the test set too
    columns: dict[str, str] | None = None    # map task fields to file columns, e.g. {"sentence": "text"}
    template: str | None = None              # classification prompt, with {sentence}; "auto": chosen zero-shot on dev, by dev loss, among the candidates of paczero/tasks/prompts.yaml (with the answer words)
    template_candidates: list[str] | None = None  # template auto: your own templates (each with {sentence}), scored on dev beside the built-in candidates
    verbalizer: dict[int, str] | None = None # classification answer words: label -> option text (default: the task's, " terrible"/" great"; with template auto, the chosen candidate's)
    labels: list[str] | None = None          # classification class names, label i the i-th (e.g. neg,pos): how the data's label values map to classes; CODE=word (ABBR=abbreviation,HUM=person) also names the word the model scores for each (its verbalizer, a space before it)
    objective: str = "nll"                   # squad training loss: "nll" | "f1"
    n_train: int = 1000                      # |U|, the training universe
    n_dev: int = 500                         # dev examples (model selection), drawn apart from U
    n_test: int | None = None                # None: the task's protocol (all of SST-2 validation, 1000 for SQuAD)
    data_seed: int = 0                       # which examples are drawn for U, dev and test
    data_fraction: float = 1.0               # DP runs on a file: the public probability that a row is used at all (a keyed hash of the row; rows a split column names dev or test always are)
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
    dp_clip: float = 25.0                    # DP baselines: per-example clip of the scalar (dp-sgd: of the gradient's L2 norm)
    sample_rate: float = 0.064               # DP baselines: Poisson sampling rate q
    accountant: str = "rdp"                  # "rdp" | "pld" (the other is reported too)
    canaries: int | None = None              # dp-sgd, dpzero on a classification task: M canaries planted in this run, each trained on with probability 1/2 (a secret in private/); `paczero audit RUN` then bounds its epsilon from below (docs/audit.md)
    batch_size: int | None = None            # mezo and adamw mini-batch (None: the whole universe)
    # optimisation
    steps: int = 1000                        # T
    lr: float = 1e-3                         # learning rate
    lr_schedule: str = "constant"            # learning-rate schedule
    weight_decay: float = 0.0                # decoupled weight decay per step
    mu: float | None = None                  # perturbation scale of the two-point difference; None: the dtype's (1e-2 for bf16, 1e-3 otherwise)
    clip: float | None = None                # stability clip c (None: off)
    num_directions: int = 1                  # K
    # evaluation and selection
    eval_every: int = 100                    # steps between dev evaluations
    dev_best: bool = True                    # release the dev-best weights (post-processing) instead of the last
    select_metric: str | None = None         # what dev-best selects by: "loss" (lowest) | "accuracy" | "f1" (highest); None: the dev loss, F1 for squad
    eval_zero_shot: bool = True              # evaluate the base model on dev and test first
    rungs: list[int] | None = None           # T-ladder: steps at which one run saves and evaluates its weights
    ood_data: str | None = None              # a second labelled file (same columns), evaluated whole at the end (and zero-shot): the out-of-domain test (summary.json ood_test)
    heldout_attack: bool = False             # after training, the loss attack on the released model: U's records against the held-out test records (summary.json heldout_attack: AUC with a bootstrap interval; a DP run keeps it in private/heldout_attack.json)
    # engineering
    token_budget: int = 4096                 # tokens per micro-batch (rows x padded length)
    lockstep_batches: int = 1                # full FT: token budgets per sign whose + and - forwards share each draw of z (0: off)
    compile: bool = False                    # torch.compile the model body (LoRA, classification tasks)
    threads: int | None = None               # CPU: torch's intra-op threads; None: the cores this process is allowed
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

    def __post_init__(self) -> None:
        self.labels, self.verbalizer = named_answer_words(self.labels, self.verbalizer)

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
        if isinstance(values.get("verbalizer"), dict):  # JSON (run.json, task.json) keeps its keys as strings
            values["verbalizer"] = {_label_key(k): v for k, v in values["verbalizer"].items()}
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
        """Check the configuration; return self. Raises ConfigError with one line (the checks by concern
        below, in this order: the first problem found is the one named)."""
        for check in (_check_model, _check_task, _check_optimisation, _check_engineering, _check_rungs_and_seeds,
                      _check_mechanism, _check_prompt_and_data):
            check(self)
        return self


# -- validation, by concern (TrainConfig.validate runs them in order) -----------------------------------------
def need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def finite_pos(name: str, v: Any, allow_zero: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    need(ok, f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {v!r}")


def integer(name: str, v: Any, lo: int) -> None:
    need(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{name} must be an integer >= {lo}, got {v!r}")


def _check_model(cfg: TrainConfig) -> None:
    """Model, track, dtype, device, LoRA."""
    need(isinstance(cfg.model, str) and cfg.model.strip() != "", "model must be a non-empty name or path")
    need(cfg.track in ("lora", "ft"), f"track must be 'lora' or 'ft', got {cfg.track!r}")
    need(cfg.device_map in (None, "auto", "balanced", "balanced_low_0", "sequential"),
         f"device_map must be auto, balanced, balanced_low_0 or sequential, got {cfg.device_map!r}")
    need(cfg.dtype in ("auto", "fp32", "bf16", "fp16"), f"dtype must be auto, fp32, bf16 or fp16, got {cfg.dtype!r}")
    need(cfg.device == "auto" or cfg.device == "cpu" or str(cfg.device).startswith("cuda"),
         f"device must be auto, cpu or cuda[:N], got {cfg.device!r}")
    integer("lora_r", cfg.lora_r, 1)
    finite_pos("lora_alpha", cfg.lora_alpha)


def _check_task(cfg: TrainConfig) -> None:
    """The task and the sizes of its splits."""
    need(cfg.task in TASKS, f"unknown task {cfg.task!r}; choose one of {', '.join(TASKS)}")
    need(cfg.objective in ("nll", "f1"), f"objective must be 'nll' or 'f1', got {cfg.objective!r}")
    integer("n_train", cfg.n_train, 2)
    integer("n_dev", cfg.n_dev, 1)
    if cfg.n_test is not None:
        integer("n_test", cfg.n_test, 1)
    need(isinstance(cfg.data_fraction, (int, float)) and not isinstance(cfg.data_fraction, bool)
         and 0 < cfg.data_fraction <= 1, f"data_fraction must be in (0, 1], got {cfg.data_fraction!r}")
    need(cfg.data_fraction == 1 or cfg.mechanism in DP_MECHANISMS,
         "data_fraction applies to a DP run's stable split; other runs draw exactly n_train rows for U")


def _check_optimisation(cfg: TrainConfig) -> None:
    """The mechanism's name, M, T, the step and the evaluations."""
    need(cfg.mechanism in MECHANISMS, f"unknown mechanism {cfg.mechanism!r}; choose one of {', '.join(MECHANISMS)}")
    integer("num_subsets", cfg.num_subsets, 2)
    need(cfg.num_subsets % 2 == 0, f"num_subsets (M) must be even, got {cfg.num_subsets}")
    integer("steps", cfg.steps, 1)
    finite_pos("lr", cfg.lr)
    need(cfg.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {cfg.lr_schedule!r}")
    finite_pos("weight_decay", cfg.weight_decay, allow_zero=True)
    if cfg.mu is not None:
        finite_pos("mu", cfg.mu)
    if cfg.clip is not None:
        finite_pos("clip", cfg.clip)
    integer("num_directions", cfg.num_directions, 1)
    integer("eval_every", cfg.eval_every, 1)
    if cfg.select_metric is not None:
        need(cfg.select_metric in SELECT_METRICS,
             f"select_metric must be one of {', '.join(SELECT_METRICS)}, got {cfg.select_metric!r}")
        need(cfg.select_metric != ("accuracy" if cfg.task in ("squad", "completion") else "f1"),
             f"select_metric {cfg.select_metric} does not apply to task {cfg.task} (its dev metrics: "
             f"{'loss, f1' if cfg.task in ('squad', 'completion') else 'loss, accuracy'})")


def _check_engineering(cfg: TrainConfig) -> None:
    """Micro-batches, compile, checkpoints, trackers, the hub, the run folder, generation."""
    integer("token_budget", cfg.token_budget, 16)
    integer("lockstep_batches", cfg.lockstep_batches, 0)
    if cfg.threads is not None:
        integer("threads", cfg.threads, 1)
    if cfg.compile:
        need(cfg.track == "lora", "compile applies to --track lora only (full fine-tuning reroutes module "
                                   "forwards inside each evaluation, which a compiled graph would not see)")
        need(cfg.task in CLASSIFICATION_TASKS, "compile applies to classification tasks only (SQuAD decodes answers "
                                   "with a key-value cache, which is not compiled here)")
        need(cfg.device_map is None, "compile does not apply to a sharded model (--device-map)")
    integer("checkpoint_every", cfg.checkpoint_every, 1)
    need(cfg.report_to in REPORT_TO, f"report_to must be one of {', '.join(REPORT_TO)}, got {cfg.report_to!r}")
    if cfg.push_to_hub is not None:
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(cfg.push_to_hub)
        except HFValidationError as e:
            raise ConfigError(f"push_to_hub {cfg.push_to_hub!r}: {str(e).splitlines()[0]}") from None
    need(not (cfg.overwrite and cfg.resume), "give --overwrite (replace the run in out_dir) or --resume "
                                               "(continue it), not both")
    if cfg.lora_targets is not None:
        need(isinstance(cfg.lora_targets, list) and len(cfg.lora_targets) > 0
             and all(isinstance(t, str) and t.strip() and "," not in t for t in cfg.lora_targets),
             f"lora_targets must be a list of module names, e.g. q_proj,v_proj, got {cfg.lora_targets!r}")
    integer("max_new_tokens", cfg.max_new_tokens, 1)
    integer("max_length", cfg.max_length, 2)
    need(cfg.task != "squad" or cfg.max_length > cfg.max_new_tokens,
         f"max_length ({cfg.max_length}) must exceed max_new_tokens ({cfg.max_new_tokens})")
    need(cfg.answer_stop in ANSWER_STOPS,
         f"answer_stop must be one of {', '.join(ANSWER_STOPS)}, got {cfg.answer_stop!r}")


def _check_rungs_and_seeds(cfg: TrainConfig) -> None:
    """T-ladder rungs and the seeds."""
    if cfg.rungs is not None:
        need(isinstance(cfg.rungs, list) and len(cfg.rungs) > 0
             and all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in cfg.rungs),
             f"rungs must be a non-empty list of steps >= 1, e.g. [500, 1000, 1500], got {cfg.rungs!r}")
        need(all(a < b for a, b in zip(cfg.rungs, cfg.rungs[1:])),
             f"rungs must be increasing, got {cfg.rungs}")
        need(cfg.rungs[-1] <= cfg.steps, f"rung {cfg.rungs[-1]} lies beyond steps ({cfg.steps}); "
                                           f"a ladder runs to its last rung (steps {cfg.rungs[-1]})")
    integer("seed", cfg.seed, 0)
    if cfg.private_seed is not None:
        integer("private_seed", cfg.private_seed, 0)


def _check_mechanism(cfg: TrainConfig) -> None:
    """Each mechanism's own settings."""
    if cfg.mechanism in MI_BUDGETED:
        need(cfg.mi_budget is not None, f"{cfg.mechanism} needs mi_budget (total MI in nats), e.g. --mi-budget 0.33")
        finite_pos("mi_budget", cfg.mi_budget)
    elif cfg.mi_budget is not None:
        raise ConfigError(f"mi_budget applies to pac-mi and hybrid only, not {cfg.mechanism}")
    need(cfg.schedule in ("adaptive", "uniform"), f"schedule must be 'adaptive' or 'uniform', got {cfg.schedule!r}")
    need(cfg.coin_step in ("move", "skip"), f"coin_step must be 'move' or 'skip', got {cfg.coin_step!r}")
    need(cfg.noised_coef in ("bit", "posterior-mean"),
         f"noised_coef must be 'bit' or 'posterior-mean', got {cfg.noised_coef!r}")
    if cfg.noised_coef != "bit":
        need(cfg.mechanism in ("pac-mi", "hybrid"),
             f"noised_coef applies to pac-mi and hybrid only, not {cfg.mechanism}")
    if cfg.coin_step != "move":
        need(cfg.mechanism in ("pac-zpl", "pac-mi", "hybrid"),
             f"coin_step applies to pac-zpl, pac-mi and hybrid only, not {cfg.mechanism}")
    if cfg.mechanism == "hybrid":
        need(cfg.switch_step is not None, "hybrid needs switch_step")
        integer("switch_step", cfg.switch_step, 0)
    if cfg.mechanism in DP_MECHANISMS:
        need(cfg.epsilon is not None, f"{cfg.mechanism} needs epsilon, e.g. --epsilon 2")
        finite_pos("epsilon", cfg.epsilon)
        need(isinstance(cfg.delta, float) and 0 < cfg.delta < 1, f"delta must be in (0, 1), got {cfg.delta!r}")
        finite_pos("dp_clip", cfg.dp_clip)
        need(isinstance(cfg.sample_rate, (int, float)) and 0 < cfg.sample_rate <= 1,
             f"sample_rate must be in (0, 1], got {cfg.sample_rate!r}")
        need(cfg.accountant in ("rdp", "pld"), f"accountant must be 'rdp' or 'pld', got {cfg.accountant!r}")
        if cfg.mechanism in FIRST_ORDER:
            _check_first_order(cfg)
        if cfg.mechanism in ("dpzero", "dpzero-aggzo1"):
            need(cfg.num_directions == 1, f"{cfg.mechanism} uses one direction per step (num_directions 1); "
                                           "use dp-aggzo for K > 1")
    elif cfg.epsilon is not None:
        raise ConfigError(f"epsilon applies to {', '.join(DP_MECHANISMS)} only, not {cfg.mechanism}")
    if cfg.canaries is not None:
        _check_canaries(cfg)
    if cfg.mechanism == NON_PRIVATE_FIRST_ORDER:
        _check_first_order(cfg)
    if cfg.batch_size is not None:
        need(cfg.mechanism in ("mezo", NON_PRIVATE_FIRST_ORDER), "batch_size applies to mezo and adamw only")
        integer("batch_size", cfg.batch_size, 1)


def _check_canaries(cfg: TrainConfig) -> None:
    """The canaries of the one-run audit (paczero/audit/canaries.py): planted in a DP run whose normaliser is
    the public q * n_train, so that nothing the run publishes depends on how many of them it drew in."""
    integer("canaries", cfg.canaries, 2)
    need(cfg.mechanism in CANARY_MECHANISMS, f"canaries apply to {' and '.join(CANARY_MECHANISMS)} (normalised by "
         f"the public q * n_train), not {cfg.mechanism}" + ("" if cfg.mechanism not in DP_MECHANISMS else
                                                           ", whose normaliser counts the canaries drawn in"))
    need(cfg.task in CLASSIFICATION_TASKS, f"canaries are labelled rows: they apply to the classification tasks "
                                           f"({', '.join(CLASSIFICATION_TASKS)}), not {cfg.task}")
    need(not cfg.heldout_attack, "canaries and heldout_attack: the attack scores the training rows, which would "
                                 "hold the canaries drawn in; audit one at a time")
    need(int(os.environ.get("WORLD_SIZE", "1")) <= 1, "canaries are planted in a run of one process (not under "
                                                       "torchrun)")


def _check_first_order(cfg: TrainConfig) -> None:
    """DP-SGD and adamw: a gradient step, so none of the zeroth-order step's settings."""
    m = cfg.mechanism
    need(cfg.num_directions == 1, f"num_directions applies to the zeroth-order mechanisms, not {m}")
    need(cfg.clip is None, f"clip (the stability clip of the two-point scalars) does not apply to {m}"
                           + ("; its per-example gradient clip is dp_clip" if m == "dp-sgd" else ""))
    need(cfg.device_map is None, f"{m} does not run on a sharded model (--device-map)")
    if m == "dp-sgd":
        need(not cfg.compile, "compile does not apply to dp-sgd (Opacus's per-example hooks run on the eager model)")
    need(cfg.task != "squad" or cfg.objective == "nll", f"{m} needs a differentiable loss: objective nll, not f1")


def _check_prompt_and_data(cfg: TrainConfig) -> None:
    """Labels, verbalizer, template and the data file."""
    if isinstance(cfg.labels, list) and any(isinstance(n, str) and "=" in n for n in cfg.labels):
        need(cfg.verbalizer is None, "give the answer words once: in --labels (CODE=word,...) or in --verbalizer")
        need(False, f"labels name every class's answer word (CODE=word,...) or none, got {cfg.labels!r}")
    if cfg.labels is not None:
        need(cfg.task in CLASSIFICATION_TASKS,
             f"labels apply to the classification tasks ({', '.join(CLASSIFICATION_TASKS)}), not {cfg.task}")
        need(isinstance(cfg.labels, list) and len(cfg.labels) >= 2
             and all(isinstance(n, str) and n.strip() and "," not in n for n in cfg.labels)
             and len({n.strip() for n in cfg.labels}) == len(cfg.labels),
             f"labels must be two or more distinct class names, e.g. negative,positive, got {cfg.labels!r}")
        need(cfg.verbalizer is None or set(cfg.verbalizer) == set(range(len(cfg.labels))),
             f"verbalizer labels {sorted(cfg.verbalizer or {}, key=str)} must be the positions 0..{len(cfg.labels) - 1} "
             f"of the {len(cfg.labels)} label names")
        need(cfg.verbalizer is not None or cfg.template == AUTO or len(cfg.labels) == 2,
             f"{len(cfg.labels)} labels need their answer words: give --verbalizer (e.g. "
             + ",".join(f"{i}= {n}" for i, n in enumerate(cfg.labels)) + ") or --template auto (chosen on dev), "
             "or name each class's word in --labels (CODE=word,...)")
    if cfg.verbalizer is not None:
        need(isinstance(cfg.verbalizer, dict) and len(cfg.verbalizer) >= 2
             and all(isinstance(v, str) and v for v in cfg.verbalizer.values()),
             "verbalizer must map at least two labels to non-empty strings")
    if cfg.template_candidates is not None:
        need(cfg.template == AUTO, "template_candidates are template auto's: give --template auto with them")
        need(isinstance(cfg.template_candidates, list) and len(cfg.template_candidates) > 0
             and all(isinstance(t, str) and "{sentence}" in t for t in cfg.template_candidates),
             f"template_candidates must be templates that each contain {{sentence}}, got {cfg.template_candidates!r}")
    if cfg.task == "classification":
        need(cfg.data not in (None, "demo"), "task classification trains on your labelled file: give --data FILE "
                                              "(columns sentence and label; --columns maps others)")
    if cfg.template == AUTO:
        need(cfg.task in CLASSIFICATION_TASKS, f"template auto chooses a classification prompt on dev "
             f"({', '.join(CLASSIFICATION_TASKS)}); it does not apply to task {cfg.task}: give its template")
    elif cfg.template is not None:
        need(cfg.task != "completion", "template does not apply to task completion: its prompts are the "
                                        "data's prompt column (or its messages)")
        allowed = ("title", "context", "question") if cfg.task == "squad" else ("sentence",)
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(cfg.template) if name is not None]
        except ValueError as e:
            raise ConfigError(f"template is not a format string ({e}); write literal braces as {{{{ and }}}}") from None
        bad = next((name for name in names if name not in allowed), None)
        need(bad is None, f"template may use {' '.join('{' + a + '}' for a in allowed)} only, not {{{bad}}}")
        if cfg.task != "squad":
            need("sentence" in names, "template must contain {sentence}")
    for key in ("data", "dev_data", "test_data"):
        value = getattr(cfg, key)
        if value is None or (key == "data" and value == "demo"):
            continue
        p = Path(value).expanduser()
        need(p.is_file(), f"{key} file {value!r} does not exist" if not p.exists() else f"{key} {value!r} is not a file")
        need(os.access(p, os.R_OK), f"{key} file {value!r} is not readable")
    need((cfg.dev_data is None and cfg.test_data is None) or cfg.data not in (None, "demo"),
         "dev_data and test_data go with a data file (--data FILE): its rows are the training rows")


def named_answer_words(labels: Any, verbalizer: Any) -> tuple[Any, Any]:
    """``labels`` of the form ``CODE=word`` (a list of such, or a dict code -> word) as the class codes and
    their answer words (label i -> ``" word"``, the verbalizer's leading space added). Anything else, a
    verbalizer of other words given beside them included, is returned as given (validate() names what is
    wrong)."""
    if isinstance(labels, dict):
        labels = [f"{code}={word}" for code, word in labels.items()]
    if not isinstance(labels, list) or not any(isinstance(n, str) and "=" in n for n in labels):
        return labels, verbalizer
    pairs = [n.split("=", 1) if isinstance(n, str) and "=" in n else (n, "") for n in labels]
    if not all(str(word).strip() for _, word in pairs):
        return labels, verbalizer
    words = {i: " " + word.strip() for i, (_, word) in enumerate(pairs)}
    if verbalizer is not None and (not isinstance(verbalizer, dict)  # the same words again (a resumed run's) are fine
                                   or {_label_key(k): v for k, v in verbalizer.items()} != words):
        return labels, verbalizer
    return [str(code).strip() for code, _ in pairs], words


def _label_key(key: Any) -> Any:
    """A verbalizer key as the integer label it names ("1" in JSON or YAML is 1); anything else is left to
    validate(), which names it."""
    try:
        return int(key) if str(key).strip().lstrip("-").isdigit() else key
    except (TypeError, ValueError):
        return key


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
        from paczero.checkpoint import run_record

        hint = (f"to continue the run in it: --resume --out-dir {str(path)!r}" if run_record(p).exists()
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
