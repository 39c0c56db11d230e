"""The one-run privacy audit with canaries (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
Training Run", NeurIPS 2023): a lower bound on a DP run's epsilon from the run itself.

A run trained with ``canaries: M`` (``paczero train ... --canaries M``: dp-sgd and dpzero on a classification
task, config.CANARY_MECHANISMS) plants them (:func:`plant`, before its first step):

1. M canaries, training rows of random words with a label (a row no model predicts from what it read
   elsewhere), public: drawn from the run's public seed, each labelled with the class the base model finds
   least likely;
2. each canary joins the training data independently with probability 1/2, from a private SHAKE-256
   stream (:class:`paczero.privacy.secure_random.SecureGenerator`), apart from the run's own noise stream; which
   canaries were drawn in is a secret of the run, kept in ``RUN/private/canaries.json`` (mode 0600) beside its
   other secrets;
3. the run trains on its universe U plus the canaries drawn in and releases its model as any run does. Its
   normaliser is the public ``q * n_train`` (DP-SGD's and DPZero's), and every public value of the run
   (run.json's ``n_train``, the summary's sizes and privacy statement, log.jsonl's sigma) is U's alone: none
   depends on which canaries, or how many, were drawn in. The guarantee covers every training row, the
   canaries as much as U's rows, and the run spends nothing besides its stated (epsilon, delta).

``paczero audit RUN`` afterwards reads that run and trains nothing (:func:`canary_audit`):

4. a membership score per canary from the released model: the rise of its label's log-odds from the base
   model to the released one, ranked among the canaries of that label (a canary that trained rises further);
   dev-best selection is post-processing: it can only hide what the audit finds;
5. guesses with abstention: 'in' for the ``k_in`` highest scores, 'out' for the ``k_out`` lowest,
   no guess on the rest (default: a quarter of the canaries each way; the counts never read the inclusion
   bits, as the bound needs);
6. from ``v`` correct guesses out of ``r``, the largest epsilon at which an (epsilon, delta)-DP training
   run would get ``v`` or more right with probability under 5 %: a lower bound on the run's epsilon at
   its delta with 95 % confidence (the paper's Corollary 5.4 and Appendix D, :func:`p_value` and
   :func:`epsilon_lower_bound`).

The bound is consistent with the run's statement when it is at most the stated epsilon; a bound above
it says the run does not execute the mechanism it states (at 95 % confidence). A bound below says
nothing more: a lower bound never proves privacy (docs/audit.md). The result goes to
``RUN/canary_audit.json``. The math at the top is numpy/scipy only.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.stats import binom

__all__ = ["RESULT_FILE", "CANARY_FILE", "p_value", "epsilon_lower_bound", "max_provable_epsilon", "guess",
           "canary_rows", "membership_scores", "word_tokens", "draw_inclusion", "Planted", "plant", "keep_planted",
           "read_planted", "planted_runs", "canary_audit", "canary_command", "format_canary_audit"]

#: where the audit's result goes in the audited run's folder (public: see :func:`canary_audit`)
RESULT_FILE = "canary_audit.json"
#: the canaries of a run and which of them trained, in the run's private/ (a secret: mode 0600)
CANARY_FILE = "canaries.json"
CONFIDENCE = 0.95


# ------------------------------------------------------------------------------ the bound (numpy/scipy only)
def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The probability that an (epsilon, delta)-DP run lets an auditor get ``v`` or more of ``r`` guesses
    right, ``m`` canaries each in with probability 1/2 (Steinke et al. 2023, Corollary 5.4):

        P[Bin(r, q) >= v] + 2 m delta max_{1 <= i <= v} P[v - i <= Bin(r, q) < v] / i,   q = e^eps / (1 + e^eps),

    capped at 1. With delta = 0 it is the binomial tail: each guess right with probability q at most, as
    randomized response with epsilon makes it."""
    _check_counts(m, r, v)
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(binom.sf(v - 1, r, q))  # P[Bin(r, q) >= v]
    if delta == 0 or v == 0:
        return min(beta, 1.0)
    i = np.arange(1, v + 1)
    below = np.cumsum(binom.pmf(v - i, r, q))  # P[v - i <= Bin(r, q) < v], i = 1..v
    alpha = float(np.max(below / i))
    return min(beta + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = CONFIDENCE) -> float:
    """The largest epsilon that ``v`` correct guesses out of ``r`` (``m`` canaries) reject at ``confidence``:
    the run is not (epsilon, delta)-DP for any epsilon below it, except with probability 1 - confidence.
    0 when even epsilon = 0 is not rejected. Found as the paper's Appendix D finds it: an upper bracket by
    steps of 1, then bisection, keeping the low (rejected) end."""
    _check_counts(m, r, v)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    level = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < level:
        lo, hi = hi, hi + 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if p_value(m, r, v, mid, delta) < level:
            lo = mid
        else:
            hi = mid
    return lo


def max_provable_epsilon(m: int, delta: float, confidence: float = CONFIDENCE) -> float:
    """The largest lower bound ``m`` canaries can give: every canary guessed, every guess right."""
    return epsilon_lower_bound(m, m, m, delta, confidence)


def guess(scores: np.ndarray, k_in: int, k_out: int) -> np.ndarray:
    """+1 ('in') for the ``k_in`` highest scores, -1 ('out') for the ``k_out`` lowest, 0 (no guess) for the
    rest; ties broken by the canary's index (a public order)."""
    s = np.asarray(scores, dtype=np.float64)
    if k_in < 0 or k_out < 0 or k_in + k_out > len(s):
        raise ValueError(f"need k_in, k_out >= 0 and k_in + k_out <= {len(s)} canaries, got {k_in} and {k_out}")
    order = np.argsort(-s, kind="stable")
    out = np.zeros(len(s), dtype=np.int64)
    out[order[:k_in]] = 1
    out[order[len(s) - k_out:]] = -1
    return out


def _check_counts(m: int, r: int, v: int) -> None:
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (m, r, v)) \
            or not 0 <= v <= r <= m:
        raise ValueError(f"need integers 0 <= v <= r <= m, got v={v!r}, r={r!r}, m={m!r}")


# ------------------------------------------------------------------------------ the canaries
def canary_rows(m: int, classes: list[int], vocabulary: list[str], seed: int = 0, words: int = 4) -> list[dict]:
    """``m`` classification rows of ``words`` words each, from the public ``seed``: words of ``vocabulary``
    (the tokenizer's whole-word tokens, :func:`word_tokens`) that no other canary uses, so that each canary
    moves weights of its own (in full fine-tuning, the embeddings of its words), and a label that nothing
    but the canary itself teaches. The labels are balanced (each class ``m / len(classes)`` times, rounded,
    in a random order), so the canaries drawn in teach no class as a whole."""
    rng = np.random.default_rng([seed, 0xCA1A27])
    if len(vocabulary) < m * words:
        raise ValueError(f"{m} canaries of {words} words need {m * words} distinct words; the tokenizer has "
                         f"{len(vocabulary)}")
    chosen = rng.choice(sorted(vocabulary), size=m * words, replace=False).reshape(m, words)
    labels = rng.permutation(np.resize(np.asarray(classes), m))
    return [{"sentence": " ".join(ws) + ".", "label": int(label)} for ws, label in zip(chosen, labels)]


def word_tokens(tokenizer) -> list[str]:
    """The lower-case words of 4 to 12 letters that ``tokenizer`` keeps as one token after a space."""
    import re

    found = set()
    for token in tokenizer.get_vocab():
        text = tokenizer.convert_tokens_to_string([token])
        if re.fullmatch(r" [a-z]{4,12}", text):
            found.add(text[1:])
    return sorted(found)


def membership_scores(base_margin: np.ndarray, released_margin: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each canary's score: how far the log-odds of its label rose from the base model to the released one,
    as its rank among the canaries of the same label (0 the least, 1 the most), so that a shift of a whole
    class (the model learning to say one label more often) moves no canary ahead of another class's. Log-odds,
    not the loss: a loss near 0 stops moving in float32, the log-odds do not."""
    from scipy.stats import rankdata

    rise = np.asarray(released_margin, np.float64) - np.asarray(base_margin, np.float64)
    labels = np.asarray(labels)
    out = np.zeros(len(rise))
    for label in np.unique(labels):
        idx = np.flatnonzero(labels == label)
        out[idx] = (rankdata(rise[idx]) - 1) / max(len(idx) - 1, 1)
    return out


def draw_inclusion(m: int, private_seed: int | None = None) -> np.ndarray:
    """Which canaries train: each independently with probability 1/2, from a SHAKE-256 stream keyed by 256
    bits of OS entropy (``private_seed``: keyed from it, for tests and exact reproduction, apart from the
    run's own streams of that seed)."""
    from paczero.privacy.secure_random import SecureGenerator

    key = None if private_seed is None else hashlib.sha256(
        b"paczero-canary-seed\x00" + str(int(private_seed)).encode()).digest()
    return np.asarray(SecureGenerator(key).integers(0, 2, size=m), dtype=bool)


# ------------------------------------------------------------------------------ the canaries planted in a run
@dataclass
class Planted:
    """A run's canaries (public: the rows, labels included) and which of them trained (private)."""
    rows: list[dict]
    included: np.ndarray  # bool, one per canary

    def drawn(self) -> list[dict]:
        return [row for row, drawn in zip(self.rows, self.included) if drawn]


def plant(setup, run_dir: str | Path, resume: bool = False) -> None:
    """Plant ``setup.cfg.canaries`` canaries in a built run, before its first step: the rows (:func:`canary_rows`
    on the tokenizer's words and the public seed, each relabelled with the class ``setup.model``, the base model,
    finds least likely: a model that only sharpens what it believed gets it wrong, one that learnt it right),
    each drawn in with probability 1/2 (:func:`draw_inclusion`; a resumed run reads its own from ``run_dir``'s
    private/). The universe the loop trains on becomes U's rows plus the canaries drawn in; ``setup.train`` (U,
    whose size the run states) stays as it is, and ``setup.planted`` holds both for :func:`keep_planted`."""
    from paczero.run.build import classes_of

    cfg = setup.cfg
    if resume:
        planted = read_planted(run_dir, "cannot resume")
    else:
        rows = canary_rows(cfg.canaries, sorted(classes_of(cfg) or (0, 1)), word_tokens(setup.tokenizer),
                           seed=cfg.seed)
        probs = setup.task.probabilities(setup.model, setup.task.encode(rows), token_budget=cfg.token_budget)
        least = np.asarray(setup.task.labels)[np.argmin(probs, axis=1)]
        rows = [{**row, "label": int(label)} for row, label in zip(rows, least)]
        planted = Planted(rows, draw_inclusion(cfg.canaries, cfg.private_seed))
    drawn = planted.drawn()
    setup.universe = list(setup.universe) + (setup.task.encode(drawn) if drawn else [])
    setup.planted = planted


def keep_planted(run_dir: str | Path, planted: Planted) -> None:
    """The canaries and their inclusion bits into ``run_dir``'s private/ (mode 0600, fixed-width encoding)."""
    from paczero.checkpoint import private_dir, write_json

    write_json(private_dir(Path(run_dir)) / CANARY_FILE,
               {"rows": planted.rows, "included": np.asarray(planted.included, dtype=bool)}, private=True)


def read_planted(run_dir: str | Path, what: str) -> Planted:
    """A run's :class:`Planted`, from its private/ (``what``: the start of the line that says it is missing)."""
    from paczero.checkpoint import PRIVATE_DIR, decode
    from paczero.config import ConfigError

    path = Path(run_dir) / PRIVATE_DIR / CANARY_FILE
    try:
        found = decode(json.loads(path.read_text()))
        planted = Planted(list(found["rows"]), np.asarray(found["included"], dtype=bool))
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{what}: {str(path)!r}, which canaries the run trained on, is missing or "
                          "unreadable") from None
    if len(planted.rows) != len(planted.included):
        raise ConfigError(f"{what}: {str(path)!r} is damaged (rows and inclusion bits differ in number)")
    return planted


# ------------------------------------------------------------------------------ the audit
def planted_runs(run_dirs: Sequence[str | Path]) -> bool:
    """Whether any of ``run_dirs`` was trained with canaries (its run.json's config ``canaries``)."""
    for run in run_dirs:
        try:
            if json.loads((Path(run).expanduser() / "run.json").read_text())["config"].get("canaries"):
                return True
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return False


def canary_audit(run_dir: str | Path, *, k_in: int | None = None, k_out: int | None = None,
                 log=print) -> dict[str, Any]:
    """The one-run audit of RUN_DIR, a finished run trained with canaries (module docstring): reads its
    canaries, their inclusion bits and its released weights; trains nothing. Writes and returns the result
    (public: the bound, the counts, the stated epsilon)."""
    from paczero.checkpoint import write_json

    run_dir, cfg, planted, k_in, k_out = _audit_inputs(run_dir, k_in, k_out)
    m, rows = cfg.canaries, planted.rows
    log(f"paczero: audit: {m} canaries of {str(run_dir)!r} against its released model (no training)")
    base, released = _margins_before_and_after(cfg, run_dir, rows)
    scores = membership_scores(base, released, np.array([row["label"] for row in rows]))
    guesses = guess(scores, k_in, k_out)
    included = planted.included
    r = int(np.count_nonzero(guesses))
    v = int(np.sum((guesses == 1) & included) + np.sum((guesses == -1) & ~included))
    stated = _stated_epsilon(run_dir)
    result = {"canaries": m, "guesses": r, "guessed_in": k_in, "guessed_out": k_out, "correct": v,
              "delta": cfg.delta, "confidence": CONFIDENCE,
              "epsilon_lower_bound": epsilon_lower_bound(m, r, v, cfg.delta),
              "epsilon_max_provable": epsilon_lower_bound(m, r, r, cfg.delta),
              "epsilon_stated": stated, "epsilon_target": cfg.epsilon, "mechanism": cfg.mechanism,
              "score": "the rise of the canary label's log-odds from the base model to the run's released weights, "
                       "ranked among the canaries of its label",
              "audited": "the run itself: its released weights, trained on its rows and the canaries drawn in"}
    result["consistent"] = None if stated is None else bool(result["epsilon_lower_bound"] <= stated)
    write_json(run_dir / RESULT_FILE, result)
    return result


def _audit_inputs(run_dir: str | Path, k_in: int | None, k_out: int | None):
    """RUN_DIR's recorded config, canaries and guess counts, checked (one line each) before a model loads."""
    from paczero.config import ConfigError

    run_dir = Path(run_dir).expanduser()
    cfg = _recorded_config(run_dir)
    if not cfg.canaries:
        raise ConfigError(f"{str(run_dir)!r} has no canaries to audit: plant them in the run itself, "
                          "paczero train ... --canaries M (dp-sgd, dpzero), then paczero audit RUN")
    m = cfg.canaries
    k_in = max(1, m // 4) if k_in is None else k_in
    k_out = max(1, m // 4) if k_out is None else k_out
    if k_in < 0 or k_out < 0 or k_in + k_out > m or k_in + k_out == 0:
        raise ConfigError(f"--guess-in and --guess-out must be >= 0 and together between 1 and the {m} "
                          f"canaries, got {k_in} and {k_out}")
    if not (run_dir / "selected.safetensors").is_file():
        raise ConfigError(f"run {str(run_dir)!r} is not finished (no selected.safetensors): the audit reads "
                          "its released weights")
    return run_dir, cfg, read_planted(run_dir, f"cannot audit {str(run_dir)!r}"), k_in, k_out


def _recorded_config(run_dir: Path):
    from paczero.config import ConfigError, TrainConfig

    try:
        values = json.loads((run_dir / "run.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{str(run_dir)!r} is not a paczero run folder (no readable run.json)") from None
    values.update(resume=False, overwrite=False, progress=False)
    return TrainConfig.from_dict(values, source=str(run_dir / "run.json")).validate()


def _margins_before_and_after(cfg, run_dir: Path, rows: list) -> tuple[np.ndarray, np.ndarray]:
    """The canaries' log-odds under the base model and under the run's released weights."""
    from safetensors.torch import load_file

    from paczero.models import trainable_parameters
    from paczero.run.build import build, load_trainable

    setup = build(cfg, examples=(rows, [], []))
    base = _margins(setup, rows)
    load_trainable(trainable_parameters(setup.model, cfg.track), load_file(str(run_dir / "selected.safetensors")))
    return base, _margins(setup, rows)


def _margins(setup, rows: list) -> np.ndarray:
    """Each row's log-odds of its label under ``setup.model``: its class score minus the log-sum-exp of the
    other classes' (the loss is log(1 + exp(-log-odds)) for two classes)."""
    import torch

    from paczero.tasks.batching import collect

    encoded = setup.task.encode(rows)
    batches = setup.task.make_batches(encoded, token_budget=setup.cfg.token_budget)
    out = []
    with torch.inference_mode():
        for batch in batches:
            batch = batch.to(setup.device)
            scores = setup.task.scores(setup.model, batch).double()
            own = batch.labels[:, None]
            out.append(scores.gather(1, own)[:, 0] - scores.scatter(1, own, float("-inf")).logsumexp(1))
    return collect(out, batches, len(encoded)).double().numpy()


def _stated_epsilon(run_dir: Path) -> float | None:
    """The epsilon the audited run states (its summary's privacy statement), if it finished: the tighter of
    its two accountants' (both are valid; the audit tests the strongest claim)."""
    try:
        privacy = json.loads((run_dir / "summary.json").read_text())["privacy"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    found = [privacy.get(k) for k in ("epsilon_rdp", "epsilon_pld")]
    found = [float(e) for e in found if isinstance(e, (int, float)) and not isinstance(e, bool)]
    return min(found) if found else None


def canary_command(ns) -> int:
    """``paczero audit RUN_DIR... [--guess-in K] [--guess-out K] [--json]`` on runs trained with canaries."""
    import sys

    from paczero.config import ConfigError

    if ns.heldout or ns.last_bits or ns.reveal_secret:
        raise ConfigError("the canary audit is an audit of its own (not with --heldout, --last-bits or "
                          "--reveal-secret)")
    for run in ns.run_dirs:  # every run checked before any model loads
        _audit_inputs(run, ns.guess_in, ns.guess_out)
    found = {str(run): canary_audit(run, k_in=ns.guess_in, k_out=ns.guess_out,
                                    log=lambda line: print(line, file=sys.stderr)) for run in ns.run_dirs}
    print(json.dumps(found, indent=1) if ns.json else "\n".join(format_canary_audit(r, f) for r, f in found.items()))
    return 0


def format_canary_audit(run: str, found: dict) -> str:
    stated = found["epsilon_stated"]
    lines = [f"{run}: one-run canary audit (Steinke et al. 2023) of {found['mechanism']}: "
             f"{found['correct']} of {found['guesses']} guesses right ({found['canaries']} canaries, "
             f"{found['guessed_in']} guessed in, {found['guessed_out']} out)",
             f"  empirical epsilon >= {found['epsilon_lower_bound']:.3f} at delta {found['delta']:g}, "
             f"{found['confidence']:.0%} confidence (at most {found['epsilon_max_provable']:.3f} with these guesses)",
             "  stated epsilon " + ("unknown (the run has no summary.json)" if stated is None else
                                    f"{stated:.3f}: " + ("consistent (the bound is at most it)" if found["consistent"]
                                                         else "VIOLATED: the bound is above it"))]
    lines.append("  a lower bound never proves privacy: a bound below the stated epsilon is consistent with it, "
                 "not evidence for it")
    return "\n".join(lines)
