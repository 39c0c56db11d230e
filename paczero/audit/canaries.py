"""The one-run privacy audit with canaries (Steinke, Nasr and Jagielski, "Privacy Auditing with One (1)
Training Run", NeurIPS 2023): a lower bound on a DP run's epsilon from one training run.

``paczero audit --canaries M RUN_DIR`` audits the configuration of a DP run (RUN_DIR's run.json):

1. M canaries, training rows of random words with a random label (a row no model predicts from what it
   read elsewhere), public: drawn from a public seed;
2. each canary joins the training data independently with probability 1/2, from a private SHAKE-256
   stream (:class:`paczero.privacy.secure_random.SecureGenerator`), apart from the run's own noise stream;
3. one training run of RUN_DIR's configuration on its training rows plus the canaries drawn in, which
   releases its last weights (dev-best selection is post-processing: it can only hide what the audit finds);
4. a membership score per canary from the released model: the rise of its label's log-odds from the base
   model to the released one, ranked among the canaries of that label (a canary that trained rises further);
5. guesses with abstention: 'in' for the ``k_in`` highest scores, 'out' for the ``k_out`` lowest,
   no guess on the rest (default: a quarter of the canaries each way; the counts are fixed before the run,
   as the bound needs);
6. from ``v`` correct guesses out of ``r``, the largest epsilon at which an (epsilon, delta)-DP training
   run would get ``v`` or more right with probability under 5 %: a lower bound on the run's epsilon at
   its delta with 95 % confidence (the paper's Corollary 5.4 and Appendix D, :func:`p_value` and
   :func:`epsilon_lower_bound`).

The bound is consistent with the run's statement when it is at most the stated epsilon; a bound above
it says the run does not execute the mechanism it states (at 95 % confidence). A bound below says
nothing more: a lower bound never proves privacy (docs/audit.md).

The audit run's training data are RUN_DIR's training rows and the canaries drawn in: the public ``n_train``
of that run counts them (the normaliser of DP-SGD's and DPZero's noisy sum, to which AdamW's and the
zeroth-order steps' direction is insensitive); the audit run goes to a temporary folder (``--keep-run``
keeps it), the result to ``RUN_DIR/canary_audit.json``. The math at the top is numpy/scipy only.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
from scipy.stats import binom

__all__ = ["RESULT_FILE", "p_value", "epsilon_lower_bound", "max_provable_epsilon", "guess", "canary_rows",
           "membership_scores", "word_tokens", "canary_command",
           "draw_inclusion", "canary_audit", "format_canary_audit"]

#: where the audit's result goes in the audited run's folder (public: see :func:`canary_audit`)
RESULT_FILE = "canary_audit.json"
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


# ------------------------------------------------------------------------------ the audit
def canary_audit(run_dir: str | Path, m: int, train: Callable[..., dict], *, k_in: int | None = None,
                 k_out: int | None = None, keep_run: str | Path | None = None, log=print) -> dict[str, Any]:
    """The one-run audit of RUN_DIR's DP configuration with ``m`` canaries (module docstring). ``train``
    is :func:`paczero.train.train` (the loop lives above this room). Writes and returns the result; the
    inclusion bits and the scores, the auditor's own secrets, go to the audit run's ``private/`` only when
    it is kept."""
    import tempfile

    from paczero.config import DP_MECHANISMS, ConfigError

    run_dir = Path(run_dir).expanduser()
    cfg = _recorded_config(run_dir)
    if cfg.mechanism not in DP_MECHANISMS:
        raise ConfigError(f"--canaries audits a DP run's (epsilon, delta) ({', '.join(DP_MECHANISMS)}); "
                          f"{str(run_dir)!r} is a {cfg.mechanism} run")
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise ConfigError(f"--canaries needs at least 2 canaries, got {m!r}")
    k_in = max(1, m // 4) if k_in is None else k_in
    k_out = max(1, m // 4) if k_out is None else k_out
    if k_in < 0 or k_out < 0 or k_in + k_out > m or k_in + k_out == 0:
        raise ConfigError(f"--guess-in and --guess-out must be >= 0 and together between 1 and the {m} "
                          f"canaries, got {k_in} and {k_out}")
    _check_task(cfg)
    with tempfile.TemporaryDirectory(prefix="paczero-canaries-") as tmp:
        out = Path(keep_run).expanduser() if keep_run is not None else Path(tmp) / "run"
        rows, base = _canaries_on_the_base_model(cfg, m)
        included = draw_inclusion(m, cfg.private_seed)
        audit_cfg = _train_audit_run(cfg, rows, included, out, train, log)
        released = _released_margins(audit_cfg, out, rows)
    scores = membership_scores(base, released, np.array([row["label"] for row in rows]))
    guesses = guess(scores, k_in, k_out)
    r = int(np.count_nonzero(guesses))
    v = int(np.sum((guesses == 1) & included) + np.sum((guesses == -1) & ~included))
    if keep_run is not None:
        _keep_private(out, included, scores, guesses)
    stated = _stated_epsilon(run_dir)
    result = {"canaries": m, "guesses": r, "guessed_in": k_in, "guessed_out": k_out, "correct": v,
              "delta": cfg.delta, "confidence": CONFIDENCE,
              "epsilon_lower_bound": epsilon_lower_bound(m, r, v, cfg.delta),
              "epsilon_max_provable": epsilon_lower_bound(m, r, r, cfg.delta),
              "epsilon_stated": stated, "epsilon_target": cfg.epsilon, "mechanism": cfg.mechanism,
              "score": "the rise of the canary label's log-odds from the base model to the audit run's last weights, "
                       "ranked among the canaries of its label",
              "audit_run": str(out) if keep_run is not None else None}
    result["consistent"] = None if stated is None else bool(result["epsilon_lower_bound"] <= stated)
    from paczero.checkpoint import write_json

    write_json(run_dir / RESULT_FILE, result)
    return result


def _recorded_config(run_dir: Path):
    from paczero.config import ConfigError, TrainConfig

    try:
        values = json.loads((run_dir / "run.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{str(run_dir)!r} is not a paczero run folder (no readable run.json)") from None
    values.update(resume=False, overwrite=False, progress=False)
    return TrainConfig.from_dict(values, source=str(run_dir / "run.json")).validate()


def _check_task(cfg) -> None:
    from paczero.config import CLASSIFICATION_TASKS, ConfigError

    if cfg.task not in CLASSIFICATION_TASKS:
        raise ConfigError(f"--canaries plants labelled rows: it audits classification runs "
                          f"({', '.join(CLASSIFICATION_TASKS)}), not task {cfg.task}")


def _canaries_on_the_base_model(cfg, m: int) -> tuple[list, np.ndarray]:
    """The canaries (:func:`canary_rows`), each relabelled with the class the base model finds least likely
    (a model that only sharpens what it already believed gets it wrong, one that learnt the canary right),
    and their log-odds under the base model."""
    from paczero.run.build import build, classes_of
    from paczero.models import load_tokenizer

    rows = canary_rows(m, sorted(classes_of(cfg) or (0, 1)), word_tokens(load_tokenizer(cfg.model)), seed=cfg.seed)
    setup = build(cfg, examples=(rows, [], []))
    probs = setup.task.probabilities(setup.model, setup.task.encode(rows), token_budget=cfg.token_budget)
    least = np.asarray(setup.task.labels)[np.argmin(probs, axis=1)]
    rows = [{**row, "label": int(label)} for row, label in zip(rows, least)]
    return rows, _margins(setup, rows)


def _train_audit_run(cfg, rows: list, included: np.ndarray, out: Path, train: Callable[..., dict], log):
    """One training run of ``cfg`` on its training rows and the canaries drawn in; its last weights released."""
    from paczero.run.build import Given, build

    setup = build(cfg, with_model=False)
    universe = list(setup.train) + [row for row, drawn in zip(rows, included) if drawn]
    audit_cfg = cfg.replace(out_dir=str(out), overwrite=True, n_train=len(universe), n_dev=len(setup.dev),
                            n_test=len(setup.test), dev_best=False, heldout_attack=False, push_to_hub=None,
                            report_to="none", rungs=None, ood_data=None, progress=False).validate()
    log(f"paczero: audit: one training run of {cfg.mechanism} with {len(rows)} canaries, each in with "
        "probability 1/2 (private)")
    train(audit_cfg, log=lambda line: None, given=Given(examples=(universe, list(setup.dev), list(setup.test)),
                                                        data_use="canary audit"))
    return audit_cfg


def _released_margins(cfg, run_dir: Path, rows: list) -> np.ndarray:
    """The canaries' log-odds under the audit run's released (last) weights."""
    from safetensors.torch import load_file

    from paczero.models import trainable_parameters
    from paczero.run.build import build, load_trainable

    setup = build(cfg, examples=(rows, [], []))
    load_trainable(trainable_parameters(setup.model, cfg.track), load_file(str(run_dir / "selected.safetensors")))
    return _margins(setup, rows)


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


def _keep_private(run_dir: Path, included: np.ndarray, scores: np.ndarray, guesses: np.ndarray) -> None:
    import os

    from paczero.checkpoint import private_dir, write_json

    path = private_dir(run_dir) / "canaries.json"
    write_json(path, {"included": included.tolist(), "scores": scores.tolist(), "guesses": guesses.tolist()})
    os.chmod(path, 0o600)


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


def canary_command(ns, train: Callable[..., dict]) -> int:
    """``paczero audit --canaries M [--guess-in K] [--guess-out K] [--keep-run DIR] [--json] RUN_DIR...``."""
    import sys

    from paczero.config import ConfigError

    if ns.canaries is None:
        raise ConfigError("--guess-in, --guess-out and --keep-run belong to --canaries M")
    if ns.heldout or ns.last_bits or ns.reveal_secret:
        raise ConfigError("--canaries is an audit of its own (not with --heldout, --last-bits or --reveal-secret)")
    if ns.keep_run is not None and len(ns.run_dirs) > 1:
        raise ConfigError("--keep-run keeps one audit run: give one RUN_DIR")
    found = {str(run): canary_audit(run, ns.canaries, train, k_in=ns.guess_in, k_out=ns.guess_out,
                                    keep_run=ns.keep_run, log=lambda line: print(line, file=sys.stderr))
             for run in ns.run_dirs}
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
