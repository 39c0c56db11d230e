"""``paczero audit``: an empirical membership-inference audit of finished runs.

The adversary is the paper's *informed adversary* (Section 2, "Instantiation
and MIA guarantees"): it knows the universe U, the M candidate subsets (the
design), the base model, the released model and, for PAC-MI, the public
transcript -- everything except the secret index j*. Its prior success is
exactly 1/2 because every record lies in M/2 of the candidates. The audit
plays that adversary on a run and measures how often it guesses, for each of
the N records of U, whether the record is in the secret training set S_{j*}.

Three attacks:

* ``loss``: per-record score = base loss - released loss (loss reduction);
  guess "member" when the score is above the run's median (balanced prior).
* ``subset``: the best use of the design for that score: each candidate j is
  scored by the mean record score of its members, j^ = argmax, and record i
  is guessed a member iff ``design[j^, i]``.
* ``transcript`` (PAC mechanisms): the Bayes-optimal posterior over j* given
  the public transcript. The per-step subset signs are not in the log, but the
  informed adversary can recompute them: it knows the base weights, the public
  direction seed, the released coefficients (so every theta_t) and the design,
  so it replays the run, recomputes the per-sample scalars at each noised step
  and applies the same Bayes update as the mechanism (``y~ s_m / sigma^2``).
  It guesses record i a member iff ``P(i in S* | transcript) > 1/2``.

The design comes from the run's private checkpoint state (the informed
adversary knows it by assumption). The secret index is read from the same
state *only to score* the guesses, in :func:`_ground_truth`; no attack sees it.

What is printed by default is public: the run's guarantee (the MIA bound of
its MI bound, the budget; 1/2 for PAC-ZPL), its realised MI spend and the
transcript adversary's own statistics (replay check, posterior, the success it
expects from its posterior), none of which needs the secret. The attacks'
scores against the truth (accuracy, AUC, "j* found", verdicts) are computed
from j* and the true membership, so they reveal the secret of a real run: they
are computed and returned only with ``reveal_secret=True`` (CLI
``--reveal-secret``), and that output is marked private.

Accuracy is the fraction of records guessed right; its 95% interval is
Wilson's for per-record decisions (the loss attack) and Hoeffding's over runs for joint
decisions (a guessed subset or posterior: a run's records move together); the AUC's is a
stratified bootstrap. Records of one run are not
independent (one secret per run), so several runs with fresh secrets pooled
into one estimate give the honest interval; per-run figures are reported too.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from paczero.config import ConfigError, TrainConfig

__all__ = ["RunEvidence", "collect_run", "audit", "auc", "wilson", "hoeffding", "format_report", "PRIVATE_WARNING"]

PAC_TRANSCRIPT = ("pac-mi", "pac-zpl", "hybrid")
Z95 = 1.959963984540054
#: the first line of every output computed with the secret
PRIVATE_WARNING = ("PRIVATE: computed with the secret (j* and the true membership); it reveals the secret "
                   "of a real run. Do not publish this output.")


# --------------------------------------------------------------- statistics
def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    den = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC (Mann-Whitney U with average ranks for ties); 0.5 if a class is empty."""
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return 0.5
    r = rankdata(s)
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def auc_interval(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray, *, reps: int = 1000,
                 seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the AUC, resampling records within (run, class) strata."""
    rng = np.random.default_rng(seed)
    s, y, g = np.asarray(scores, float), np.asarray(labels, bool), np.asarray(groups)
    strata = [np.flatnonzero((g == gi) & (y == yi)) for gi in np.unique(g) for yi in (False, True)]
    strata = [st for st in strata if len(st)]
    stats = np.empty(reps)
    for r in range(reps):
        idx = np.concatenate([rng.choice(st, size=len(st), replace=True) for st in strata])
        stats[r] = auc(s[idx], y[idx])
    lo, hi = np.quantile(stats, [0.025, 0.975])
    return (float(lo), float(hi))


# ------------------------------------------------------------- one run
@dataclass
class RunEvidence:
    """What the adversary computed on one run, plus (when read) the truth used to score it."""
    run_dir: str
    mechanism: str
    num_subsets: int
    design: np.ndarray            # [M, N] bool (known to the informed adversary)
    loss_score: np.ndarray        # [N] base loss - released loss
    transcript_post: np.ndarray | None  # [M] posterior over j* from the public transcript
    replay_check: dict | None     # consistency of the replay with the logged q+ values
    mi_spent: float | None        # realised: the sum of this run's per-release charges (not a bound)
    mi_bound: float | None        # the guarantee: I(S*; transcript) <= mi_bound (None: no claim)
    bound: float | None           # the MIA success bound of mi_bound (None: no claim)
    member: np.ndarray | None     # [N] bool, the truth (scoring only; None unless read)
    secret: int | None            # j* (scoring only; None unless read)


def _load_config(run_dir: Path) -> TrainConfig:
    from paczero.run.build import refuse_in_memory

    try:
        record = json.loads((run_dir / "run.json").read_text())
        values = record["config"]
    except (OSError, ValueError, KeyError):
        raise ConfigError(f"{str(run_dir)!r} is not a paczero run folder (no readable run.json)") from None
    refuse_in_memory(record, str(run_dir), "paczero audit")
    if isinstance(values.get("verbalizer"), dict):
        values["verbalizer"] = {int(k): v for k, v in values["verbalizer"].items()}
    values.update(resume=False, overwrite=False, progress=False)
    return TrainConfig.from_dict(values, source=str(run_dir / "run.json")).validate()


def _private_state(run_dir: Path) -> dict:
    from paczero.checkpoint import load_latest_checkpoint

    found = load_latest_checkpoint(run_dir, warn=lambda *_: None)
    if found is None:
        raise ConfigError(f"run {str(run_dir)!r} has no readable checkpoint (the design lives there)")
    return found[3]["mechanism"]


def _design(state: dict) -> np.ndarray:
    design = state.get("design")
    if design is None:
        raise ConfigError(f"mechanism {state.get('mechanism')!r} has no candidate subsets: "
                          "the membership audit applies to runs with a design (PAC and *_half variants)")
    return np.asarray(design, dtype=bool)


def _ground_truth(state: dict, design: np.ndarray) -> tuple[int, np.ndarray]:
    """The secret index and the true membership vector: used ONLY to score the attacks."""
    secret = int(state["secret"])
    return secret, design[secret].copy()


def _per_record_losses(setup, batches) -> np.ndarray:
    import torch

    from paczero.tasks import collect

    out = []
    with torch.inference_mode():
        for b in batches:
            out.append(setup.task.losses(setup.model, b.to(setup.device)))
    return collect(out, batches, len(setup.universe)).double().numpy()


def _replay_posterior(setup, cfg: TrainConfig, params, design: np.ndarray, records: list[dict],
                      batches) -> tuple[np.ndarray, dict]:
    """The transcript adversary: replay theta_t from public data, recompute the subset signs
    at every noised step and apply the mechanism's Bayes update on (y~, sigma)."""
    from paczero.run.distributed import SingleProcess
    from paczero.privacy.subsets import subset_signs
    from paczero.zo import Perturber, stability_clip, zo_step

    m = design.shape[0]
    log_post = np.full(m, -math.log(m))
    perturber = Perturber(setup.model, params, cfg.seed, lockstep=cfg.lockstep_batches,
                          token_budget=cfg.token_budget)
    n = len(setup.universe)
    worst, noised = 0.0, 0
    try:
        for rec in records:
            step = rec["step"]
            branches = rec["branch"] if isinstance(rec["branch"], list) else [rec["branch"]]
            published = (rec["coef"] if isinstance(rec["coef"], list) else [rec["coef"]], rec["lr"])
            # noised releases move the posterior; a charged unanimity (tolerance unanimity) rules out the
            # candidates whose sign differs from the released one
            if "noised" in branches or ("unanimous" in branches and (rec.get("mi_step") or 0.0) > 0.0):
                k = len(branches)
                ys = rec["y_tilde"] if k > 1 else [rec["y_tilde"]]
                sig = rec["sigma"] if k > 1 else [rec["sigma"]]
                bits = rec["bit"] if k > 1 else [rec["bit"]]
                g = zo_step(step, batches, n, perturber=perturber, ranks=SingleProcess(),
                            loss_fn=lambda b: setup.task.losses(setup.model, b), num_directions=cfg.num_directions,
                            mu=cfg.mu, clip=cfg.clip, weight_decay=cfg.weight_decay, device=setup.device,
                            release=lambda clipped: published).scalars  # the step, with its published release
                signs = subset_signs(stability_clip(g, cfg.clip), design)
                for j in range(k):
                    post = np.exp(log_post - log_post.max())
                    post /= post.sum()
                    if j == 0 and rec.get("q_plus") is not None:
                        worst = max(worst, abs(float(post[signs[j] == 1].sum()) - rec["q_plus"]))
                    if branches[j] == "unanimous":
                        log_post = np.where(signs[j] == bits[j], log_post, -math.inf)
                        log_post -= log_post.max()
                    if branches[j] != "noised":
                        continue
                    noised += 1
                    log_post = log_post + (ys[j] / (sig[j] * sig[j])) * signs[j]
                    log_post -= log_post.max()
                    log_post -= math.log(np.exp(log_post).sum())
            else:  # nothing to learn from this step's signs: only its published update
                perturber.apply_update(step, *published, cfg.weight_decay)
    finally:
        perturber.remove()
    post = np.exp(log_post - log_post.max())
    return post / post.sum(), {"noised_releases": noised, "max_q_plus_error": worst}


def _guarantee(privacy: dict) -> float | None:
    """The run's MI bound (nats): the statement's ``mi_bound``, else its budget; None without a claim."""
    if not privacy.get("private"):
        return None
    value = privacy.get("mi_bound", privacy.get("mi_total_budget"))
    return None if value is None else float(value)


def collect_run(run_dir: str | Path, *, with_truth: bool = True) -> RunEvidence:
    """Play the informed adversary on one finished run; ``with_truth``: also read j* and the true
    membership (from the private state) to score it."""
    from safetensors.torch import load_file

    from paczero.models import trainable_parameters
    from paczero.privacy import mia_bound
    from paczero.run.build import build, load_trainable

    path = Path(run_dir).expanduser()
    cfg = _load_config(path)
    if not (path / "selected.safetensors").exists():
        raise ConfigError(f"run {str(run_dir)!r} is not finished (no selected.safetensors)")
    state = _private_state(path)
    design = _design(state)
    setup = build(cfg)  # the base model (same public init seed)
    if design.shape[1] != len(setup.universe):
        raise ConfigError(f"run {str(run_dir)!r}: the design covers {design.shape[1]} records but the "
                          f"rebuilt universe has {len(setup.universe)} (data changed?)")
    params = trainable_parameters(setup.model, cfg.track)
    batches = setup.task.make_batches(setup.universe, token_budget=cfg.token_budget)  # as the run had them
    base = _per_record_losses(setup, batches)

    post, check = None, None
    if cfg.mechanism in PAC_TRANSCRIPT:
        records = [json.loads(line) for line in (path / "log.jsonl").read_text().splitlines() if line.strip()]
        if len(records) != cfg.steps:
            raise ConfigError(f"run {str(run_dir)!r}: log.jsonl holds {len(records)} of {cfg.steps} steps")
        if any("noised" in (r["branch"] if isinstance(r["branch"], list) else [r["branch"]]) for r in records):
            post, check = _replay_posterior(setup, cfg, params, design, records, batches)
        else:  # no noised release: the transcript carries no information about j*
            post = np.full(design.shape[0], 1.0 / design.shape[0])
            check = {"noised_releases": 0, "max_q_plus_error": 0.0}

    load_trainable(params, load_file(str(path / "selected.safetensors")))
    released = _per_record_losses(setup, batches)

    privacy: dict = {}
    summary_path = path / "summary.json"
    if summary_path.exists():
        privacy = json.loads(summary_path.read_text()).get("privacy") or {}
    mi_bound = _guarantee(privacy)
    bound = None if mi_bound is None else mia_bound(mi_bound)
    mi_spent = float(privacy["mi_spent"]) if privacy.get("private") and privacy.get("mi_spent") is not None else None
    secret, member = _ground_truth(state, design) if with_truth else (None, None)
    return RunEvidence(str(path), cfg.mechanism, design.shape[0], design, base - released, post, check,
                       mi_spent, mi_bound, bound, member, secret)


# ------------------------------------------------------------- attacks
def _loss_guess(ev: RunEvidence) -> np.ndarray:
    return ev.loss_score > np.median(ev.loss_score)


def _subset_choice(ev: RunEvidence) -> tuple[int, np.ndarray]:
    d = ev.design.astype(np.float64)
    per_subset = d @ ev.loss_score / d.sum(axis=1)
    j = int(np.argmax(per_subset))
    soft = d.T @ per_subset / d.sum(axis=0)  # record score: mean score of the candidates holding it
    return j, soft


def _transcript_guess(ev: RunEvidence) -> tuple[int, np.ndarray, np.ndarray]:
    p = ev.design.T.astype(np.float64) @ ev.transcript_post  # P(i in S* | transcript)
    j = int(np.argmax(ev.transcript_post))
    guess = np.where(np.abs(p - 0.5) > 1e-12, p > 0.5, ev.design[j])  # exact ties: the MAP candidate
    return j, p, guess


def hoeffding(values: Sequence[float], alpha: float = 0.05) -> tuple[float, float]:
    """Two-sided Hoeffding interval for the mean of values in [0, 1] (valid for any dependence
    inside a value: used with one value per run)."""
    r = len(values)
    mean = float(np.mean(values))
    half = math.sqrt(math.log(2.0 / alpha) / (2.0 * r))
    return (max(0.0, mean - half), min(1.0, mean + half))


def _summarise(correct: list[np.ndarray], scores: list[np.ndarray], labels: list[np.ndarray],
               reps: int, seed: int, unit: str) -> dict:
    """Pooled accuracy and AUC. ``unit="record"``: Wilson interval over the pooled records
    (the guesses are per-record decisions); ``unit="run"``: Hoeffding interval over the per-run
    accuracies (one joint decision per run, e.g. a guessed subset, makes a run's records move together)."""
    from scipy.stats import rankdata

    c = np.concatenate(correct)
    k, n = int(c.sum()), len(c)
    per_run = [float(x.mean()) for x in correct]
    groups = np.concatenate([np.full(len(s), i) for i, s in enumerate(scores)])
    # scores of different runs live on different scales: pool within-run percentile ranks
    ranks = np.concatenate([rankdata(s) / len(s) for s in scores])
    y = np.concatenate(labels)
    lo, hi = wilson(k, n) if unit == "record" else hoeffding(per_run)
    a_lo, a_hi = auc_interval(ranks, y, groups, reps=reps, seed=seed)
    return {"accuracy": k / n, "accuracy_ci95": [lo, hi], "interval": "wilson over records" if unit == "record"
            else "hoeffding over runs", "auc": auc(ranks, y), "auc_ci95": [a_lo, a_hi],
            "records": n, "per_run_accuracy": per_run}


def _transcript_statistics(ev: RunEvidence) -> dict:
    """What the transcript adversary knows about one run without the secret: its replay check and
    its posterior over j*, with the success it expects from that posterior (a per-run value)."""
    post = ev.transcript_post
    p = ev.design.T.astype(np.float64) @ post  # P(i in S* | transcript)
    nz = post[post > 0]
    return {**(ev.replay_check or {}), "posterior_max": float(post.max()),
            "posterior_entropy_nats": float(-(nz * np.log(nz)).sum()), "prior_max": 1.0 / len(post),
            "expected_accuracy": float(np.maximum(p, 1 - p).mean())}


def audit(run_dirs: Sequence[str | Path], *, bootstrap: int = 1000, seed: int = 0,
          evidence: list[RunEvidence] | None = None, reveal_secret: bool = False) -> dict[str, Any]:
    """Audit one run or pool several (fresh secrets) into one estimate; returns a JSON-able report.

    By default the report holds only what is public: the guarantee (``mi_bound``, ``mia_bound``),
    the realised spend (``mi_spent``) and the transcript adversary's own statistics
    (``transcript``). ``reveal_secret=True`` adds the attacks scored against the truth
    (``attacks``: accuracy, AUC, ``secret_found``, verdicts), which are computed from j* and the
    true membership; the report is then marked ``"private": true`` and must not be published.
    """
    evs = evidence if evidence is not None else [collect_run(r, with_truth=reveal_secret) for r in run_dirs]
    if not evs:
        raise ConfigError("audit needs at least one run folder")
    mechs = sorted({e.mechanism for e in evs})
    bounds = [e.bound for e in evs]
    bound = None if any(b is None for b in bounds) else float(np.mean(bounds))
    report: dict[str, Any] = {
        "runs": [e.run_dir for e in evs], "mechanism": mechs[0] if len(mechs) == 1 else mechs,
        "private": bool(reveal_secret),
        "records_per_run": [e.design.shape[1] for e in evs],
        "mi_bound": [e.mi_bound for e in evs],
        "mia_bound": bound,
        "prior": 0.5,
        "mi_spent": [e.mi_spent for e in evs],
    }

    if all(e.transcript_post is not None for e in evs):
        stats = [_transcript_statistics(e) for e in evs]
        report["transcript"] = {"per_run": stats,
                                "expected_accuracy_mean": float(np.mean([x["expected_accuracy"] for x in stats]))}
    else:
        report["transcript"] = None
        report["transcript_note"] = ("not applicable: the transcript adversary is defined for the PAC "
                                     "mechanisms (pac-mi, pac-zpl, hybrid)")
    if not reveal_secret:
        return report
    if any(e.member is None or e.secret is None for e in evs):
        raise ConfigError("reveal_secret needs the runs' truth (collect_run(..., with_truth=True))")
    report["warning"] = PRIVATE_WARNING
    report["attacks"] = {}
    loss_correct = [(_loss_guess(e) == e.member) for e in evs]
    report["attacks"]["loss"] = _summarise(loss_correct, [e.loss_score for e in evs],
                                           [e.member for e in evs], bootstrap, seed, "record")
    choices = [_subset_choice(e) for e in evs]
    sub_correct = [(e.design[j] == e.member) for e, (j, _) in zip(evs, choices)]
    sub = _summarise(sub_correct, [soft for _, soft in choices], [e.member for e in evs], bootstrap, seed, "run")
    hits = sum(int(j == e.secret) for e, (j, _) in zip(evs, choices))
    sub.update(secret_found=hits, secret_found_ci95=list(wilson(hits, len(evs))), chance=1.0 / evs[0].num_subsets)
    report["attacks"]["subset"] = sub
    if report["transcript"] is not None:
        tg = [_transcript_guess(e) for e in evs]
        tr = _summarise([g == e.member for e, (_, _, g) in zip(evs, tg)], [p for _, p, _ in tg],
                        [e.member for e in evs], bootstrap, seed, "run")
        hits = sum(int(j == e.secret) for e, (j, _, _) in zip(evs, tg))
        tr.update(secret_found=hits, secret_found_ci95=list(wilson(hits, len(evs))),
                  posterior_expected_accuracy=report["transcript"]["expected_accuracy_mean"],
                  replay=[e.replay_check for e in evs])
        report["attacks"]["transcript"] = tr
    else:
        report["attacks"]["transcript"] = None
    for att in report["attacks"].values():
        if att is not None:
            att["verdict"] = _verdict(att["accuracy_ci95"], bound)
    return report


def _verdict(ci: list[float], bound: float | None) -> str:
    if bound is None:
        return "no guarantee to check (non-private mechanism)" if ci[0] <= 0.5 else \
            "leaks: accuracy above the prior 0.5 (non-private mechanism)"
    if ci[0] > bound:
        return "VIOLATION: accuracy significantly above the guaranteed bound"
    return "consistent with the bound"


def _fmt_list(values: list, spec: str) -> str:
    return ", ".join("n/a" if v is None else format(v, spec) for v in values)


def format_report(rep: dict) -> str:
    """The report in words. Without ``attacks`` (the default) every line is public; with them
    (``reveal_secret``) the output opens with :data:`PRIVATE_WARNING`."""
    b = rep["mia_bound"]
    lines = [PRIVATE_WARNING] if rep.get("attacks") is not None else []
    lines += [f"paczero audit: {len(rep['runs'])} run(s), mechanism {rep['mechanism']}, "
              f"{sum(rep['records_per_run'])} records",
              "Guarantee: " + ("none (non-private)" if b is None else
                               f"I(S*; transcript) <= {_fmt_list(rep['mi_bound'], '.6g')} nats per run, so MIA "
                               f"success <= {b:.4f} (prior 0.5"
                               + ("; the mean of the runs' bounds)" if len(set(rep["mi_bound"])) > 1 else ")"))]
    if b is not None:
        lines.append(f"Realised MI spend per run: {_fmt_list(rep['mi_spent'], '.6g')} nats (the sum of the run's "
                     "per-release charges; one run's value, not a bound: the guarantee bounds its expectation)")
    tr = rep.get("transcript")
    if tr is None:
        lines.append(f"Transcript adversary: {rep.get('transcript_note', 'n/a')}")
    else:
        per = tr["per_run"]
        lines.append(f"Transcript adversary (public: replays the transcript, needs no secret): "
                     f"{sum(x.get('noised_releases', 0) for x in per)} noised release(s) replayed, max q+ error "
                     f"{max(x.get('max_q_plus_error', 0.0) for x in per):.3g}; posterior max "
                     f"{_fmt_list([x['posterior_max'] for x in per], '.3f')} (prior {per[0]['prior_max']:.3f}); "
                     f"success it expects from its posterior {tr['expected_accuracy_mean']:.3f} (per-run values; "
                     "the bound applies to their expectation over runs)")
    if rep.get("attacks") is None:
        lines.append("Attack accuracies against the true membership are not shown: they are computed with the "
                     "secret. `paczero audit --reveal-secret` prints them; that output is private.")
        return "\n".join(lines)
    names = {"loss": "loss reduction, median threshold", "subset": "subset MAP on loss reduction",
             "transcript": "Bayes posterior from the transcript"}
    for key, att in rep["attacks"].items():
        if att is None:
            lines.append(f"  {names[key]:38s} {rep.get('transcript_note', 'n/a')}")
            continue
        lo, hi = att["accuracy_ci95"]
        alo, ahi = att["auc_ci95"]
        extra = f"; j* found {att['secret_found']}/{len(rep['runs'])}" if "secret_found" in att else ""
        lines.append(f"  {names[key]:38s} acc {att['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]  "
                     f"AUC {att['auc']:.3f} [{alo:.3f}, {ahi:.3f}]{extra}  -> {att['verdict']}")
    return "\n".join(lines)
