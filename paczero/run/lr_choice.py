"""The learning rate chosen on dev: ``paczero train ... --lr 1e-3,5e-3,2e-2`` (or ``--lr auto``, the grid of the
mechanism's family, :data:`AUTO_GRIDS`) trains the same configuration once per value, each candidate a full run in
``OUT_DIR/lr-candidates/lr-<value>/``, keeps the one whose released weights have the lowest dev loss (ties: the
higher dev accuracy, then the earlier value), and moves its files into ``OUT_DIR``, so that ``OUT_DIR`` is a plain
run (``paczero eval OUT_DIR``, predict, push and the model card as for any run). ``OUT_DIR/lr_choice.json`` records
every candidate's dev figures and seconds, the choice and the privacy of the whole choice.

The privacy of the choice (docs/privacy.md), where the k candidates are k runs on the same training records:

* PAC-ZPL: each candidate draws its own secret and its transcript carries 0 nats about it; MI of independent
  transcripts adds (0 + ... + 0 = 0), and choosing reads dev only, so the released model stays at MI = 0.
* PAC-MI and hybrid with budget B: each candidate runs at B / k, so the k transcripts together carry at most B.
* DP mechanisms: each candidate runs at (epsilon / k, delta / k); by basic composition all k together, and so the
  choice, are (epsilon, delta)-DP.
* mezo, adamw and the other references: no privacy, k plain runs.

The loop is handed in (``train_fn``: :func:`paczero.train.train`): this room does not import the loop.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from paczero.checkpoint import RunLock, atomic_json, clear_run_dir, prepare_run_dir
from paczero.config import DP_MECHANISMS, MI_BUDGETED, ConfigError, TrainConfig

#: ``--lr auto``: three values a family, around the rates dev chose for it in docs/results.md
AUTO_GRIDS = {
    "pac": (5e-3, 1e-2, 2e-2),                # pac-zpl, pac-mi, hybrid (a sign step)
    "dp-zeroth-order": (1e-3, 2.5e-3, 5e-3),  # dpzero, dp-aggzo, dpzero-aggzo1
    "first-order": (3e-4, 1e-3, 3e-3),        # dp-sgd, adamw
    "zeroth-order": (1e-3, 5e-3, 1e-2),       # mezo and the other non-private references
}
CANDIDATES_DIR = "lr-candidates"
CHOICE_FILE = "lr_choice.json"
RULE = "the lowest dev loss of each run's released weights (ties: the higher dev accuracy, then the earlier value)"


def family(mechanism: str) -> str:
    if mechanism in ("pac-zpl", "pac-mi", "hybrid"):
        return "pac"
    if mechanism in ("dp-sgd", "adamw"):
        return "first-order"
    return "dp-zeroth-order" if mechanism in DP_MECHANISMS else "zeroth-order"


def candidates(cfg: TrainConfig, lr_flag: Any) -> tuple[float, ...] | None:
    """The learning rates ``--lr`` names (None: one value, a plain run); refused in one line (before anything
    loads) with ``--resume``, under torchrun, or with canaries."""
    if not (lr_flag == "auto" or isinstance(lr_flag, (tuple, list))):
        return None
    lrs = AUTO_GRIDS[family(cfg.mechanism)] if lr_flag == "auto" else tuple(lr_flag)
    if cfg.resume:
        raise ConfigError("--resume continues one run: a learning-rate choice (--lr with several values, or auto) "
                          "cannot be resumed; give one --lr, or start the choice again with --overwrite")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("a learning-rate choice runs its candidates one after another in one process: "
                          "not under torchrun; give one --lr")
    if cfg.canaries:
        raise ConfigError("--canaries plants its canaries in one run, the one the audit reads: a learning-rate "
                          "choice trains several; give one --lr")
    return lrs


def _below(total: float, k: int) -> float:
    """``total / k``, rounded down until k of them add up to at most ``total`` in floating point."""
    share = total / k
    while math.fsum([share] * k) > total:
        share = math.nextafter(share, 0.0)
    return share


def candidate_config(cfg: TrainConfig, lr: float, k: int) -> TrainConfig:
    """One candidate: ``cfg`` at ``lr`` in its own folder, with a k-th of the privacy budget (MI budget, or
    epsilon and delta); it pushes nothing (the released run does, from ``OUT_DIR``)."""
    changes: dict[str, Any] = {"lr": lr, "out_dir": str(Path(cfg.out_dir) / CANDIDATES_DIR / folder_name(lr)),
                               "overwrite": False, "push_to_hub": None}
    if cfg.mechanism in MI_BUDGETED:
        changes["mi_budget"] = _below(cfg.mi_budget, k)
    if cfg.mechanism in DP_MECHANISMS:
        changes.update(epsilon=_below(cfg.epsilon, k), delta=_below(cfg.delta, k))
    return cfg.replace(**changes).validate()


def folder_name(lr: float) -> str:
    return f"lr-{lr:g}"


def score(summary: dict[str, Any]) -> tuple[float, float]:
    """What the choice reads of a finished run: its released weights' dev loss (non-finite: worst) and dev
    accuracy (F1 on squad; missing: worst)."""
    dev = summary.get("dev") or {}
    loss, acc = dev.get("loss"), dev.get("accuracy", dev.get("f1"))
    loss = float(loss) if isinstance(loss, (int, float)) and math.isfinite(loss) else math.inf
    acc = float(acc) if isinstance(acc, (int, float)) and math.isfinite(acc) else -math.inf
    return loss, acc


def best(summaries: list[dict[str, Any]]) -> int:
    """The index of the chosen run (:data:`RULE`)."""
    return min(range(len(summaries)), key=lambda i: (score(summaries[i])[0], -score(summaries[i])[1], i))


def choice_privacy(cfg: TrainConfig, summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The privacy of the whole choice, from the candidates' own statements, and one sentence saying it."""
    from paczero.privacy import dp_mia_bound, mia_bound

    k, m = len(summaries), cfg.mechanism
    stated = [s.get("privacy") or {} for s in summaries]
    if m == "pac-zpl":
        total = math.fsum(p.get("mi_bound", 0.0) for p in stated)
        return {"kind": "mi", "mi_bound_each": 0.0, "mi_bound": total, "mia_bound": mia_bound(total),
                "text": f"Privacy of the choice: each of the {k} candidates drew its own secret S* and its transcript "
                        "carries 0 nats about it (PAC-ZPL); MI of independent transcripts adds (0 + ... + 0 = 0) and "
                        "the choice reads dev only, so the released model's guarantee stays MI = 0 "
                        f"(MIA <= {mia_bound(total):.4f})."}
    if m in MI_BUDGETED:
        each = [p["mi_bound"] for p in stated]
        total = math.fsum(each)
        return {"kind": "mi", "mi_budget": cfg.mi_budget, "mi_bound_each": max(each), "mi_bound": total,
                "mia_bound": mia_bound(total),
                "text": f"Privacy of the choice: the MI budget {cfg.mi_budget:g} nats is split over the {k} candidates "
                        f"({max(each):.6g} nats each, each its own secret S*); MI of independent transcripts adds, so "
                        f"the {k} transcripts together, and the choice among them (it reads dev only), carry at most "
                        f"{total:.6g} <= {cfg.mi_budget:g} nats (MIA <= {mia_bound(total):.4f})."}
    if m in DP_MECHANISMS:
        acc = cfg.accountant
        eps = [p.get(f"epsilon_{acc}", p.get("epsilon_rdp")) for p in stated]
        deltas = [p["delta"] for p in stated]
        extra = math.fsum(p.get("delta_discretization", 0.0) for p in stated)
        epsilon, delta = math.fsum(eps), math.fsum(deltas)
        return {"kind": "dp", "epsilon_target": cfg.epsilon, "delta_target": cfg.delta, "epsilon_each": eps,
                "delta_each": deltas, "epsilon": epsilon, "delta": delta, "delta_discretization": extra,
                "composition": "basic (epsilons and deltas add)", "mia_bound": dp_mia_bound(epsilon, delta),
                "text": f"Privacy of the choice: each of the {k} candidates is a ({cfg.epsilon / k:.4g}, "
                        f"{cfg.delta / k:.3g})-DP run on the same training records; by basic composition the {k} "
                        f"together, and the choice among them (it reads dev only), are ({epsilon:.4g}, {delta:.3g})-DP "
                        f"by the {acc.upper()} accountant, within the target ({cfg.epsilon:g}, {cfg.delta:g})"
                        + (f" (drawing the noise exactly adds {extra:.2g} to delta)" if extra else "") + "."}
    return {"kind": "none", "text": f"No privacy: {m} carries no guarantee; the choice is {k} plain runs."}


def choose_lr(cfg: TrainConfig, lrs: tuple[float, ...], train_fn: Callable[..., dict], *,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train one candidate per value of ``lrs``, choose on dev, release the chosen run as the run in
    ``cfg.out_dir``; the chosen run's summary (with ``lr_choice``), or a stopped candidate's."""
    k, out = len(lrs), Path(cfg.out_dir).expanduser()
    configs = [candidate_config(cfg, lr, k) for lr in lrs]  # bad settings: one line before anything runs
    if cfg.overwrite:
        _clear_stopped_choice(out)
    run_dir, lock = prepare_run_dir(cfg.out_dir, overwrite=cfg.overwrite, resume=False,
                                    reads={"data file": cfg.data if cfg.data not in (None, "demo") else None})
    try:
        if cfg.overwrite:
            clear_run_dir(run_dir)
        log(f"paczero: lr choice: {k} candidates ({', '.join(f'{lr:g}' for lr in lrs)}), each a full run of this "
            f"config in {cfg.out_dir}/{CANDIDATES_DIR}/: {k} runs, about {k} times one run's time; chosen by "
            f"{RULE}" + _split_words(cfg, k))
        summaries, seconds = [], []
        for lr, one in zip(lrs, configs):
            log(f"paczero: lr candidate {len(summaries) + 1}/{k}: lr {lr:g} in {one.out_dir}")
            start = time.monotonic()
            summary = train_fn(one, log=log)
            if "stopped_at" in summary:
                log(f"paczero: lr choice stopped in candidate lr {lr:g}: no run released in {cfg.out_dir}")
                return summary
            summaries.append(summary)
            seconds.append(None if cfg.mechanism in DP_MECHANISMS else time.monotonic() - start)
        chosen = best(summaries)
        record = _record(cfg, lrs, summaries, seconds, chosen)
        _release(out / CANDIDATES_DIR / folder_name(lrs[chosen]), out, cfg, record)
        atomic_json(out / CHOICE_FILE, record)
    finally:
        try:  # a choice refused in its first candidate leaves no empty folder behind
            (out / CANDIDATES_DIR).rmdir()
        except OSError:
            pass
        lock.release()
    for line in format_choice(record, cfg.out_dir):
        log(line)
    summary = summaries[chosen]
    summary["lr_choice"] = _summary_entry(record)
    return summary


def _clear_stopped_choice(out: Path) -> None:
    """A choice stopped before its release leaves only candidates in ``out``: ``--overwrite`` replaces them."""
    from paczero.checkpoint import run_record

    found = out / CANDIDATES_DIR
    if not found.is_dir() or run_record(out).exists():
        return  # a released run: prepare_run_dir and clear_run_dir handle it
    if {p.name for p in out.iterdir()} - {CANDIDATES_DIR, CHOICE_FILE, RunLock.NAME}:
        return  # something else is there: prepare_run_dir refuses it
    if all(p.name.startswith("lr-") and p.is_dir() and (run_record(p).exists() or not any(p.iterdir()))
           for p in found.iterdir()):
        shutil.rmtree(found)


def _split_words(cfg: TrainConfig, k: int) -> str:
    if cfg.mechanism in MI_BUDGETED:
        return f"; the MI budget {cfg.mi_budget:g} split: {_below(cfg.mi_budget, k):.6g} nats a candidate"
    if cfg.mechanism in DP_MECHANISMS:
        return (f"; the DP budget split: epsilon {_below(cfg.epsilon, k):.4g} and delta "
                f"{_below(cfg.delta, k):.3g} a candidate (basic composition)")
    return ""


def _record(cfg, lrs, summaries, seconds, chosen) -> dict[str, Any]:
    rows = []
    for i, (lr, summary, secs) in enumerate(zip(lrs, summaries, seconds)):
        rows.append({"lr": lr, "folder": "." if i == chosen else f"{CANDIDATES_DIR}/{folder_name(lr)}",
                     "dev": summary.get("dev"), "selected_step": summary.get("selected_step"), "seconds": secs,
                     "privacy": {key: (summary.get("privacy") or {}).get(key) for key in
                                 ("mi_bound", "epsilon_rdp", "epsilon_pld", "delta", "noise_multiplier")
                                 if key in (summary.get("privacy") or {})}})
    privacy = choice_privacy(cfg, summaries)
    return {"rule": RULE, "mechanism": cfg.mechanism, "runs": len(lrs),
            "cost": f"{len(lrs)} runs: about {len(lrs)} times one run's time",
            "seconds_note": ("a DP run's time is private (it tells its Poisson batches' sizes): not recorded"
                             if cfg.mechanism in DP_MECHANISMS else "wall-clock seconds of each candidate"),
            "candidates": rows, "chosen": {"index": chosen, "lr": lrs[chosen]}, "privacy": privacy}


def _summary_entry(record: dict[str, Any]) -> dict[str, Any]:
    lrs = ", ".join(f"{row['lr']:g}" for row in record["candidates"])
    return {"lrs": [row["lr"] for row in record["candidates"]], "chosen": record["chosen"]["lr"],
            "line": f"{record['chosen']['lr']:g}, chosen on dev among {lrs} ({record['runs']} runs) by the lowest "
                    "dev loss of each run's released weights. " + record["privacy"]["text"],
            "privacy": {k: v for k, v in record["privacy"].items() if k != "text"}}


def _release(source: Path, out: Path, cfg: TrainConfig, record: dict[str, Any]) -> None:
    """Move the chosen candidate's files into ``out``; its records name ``out`` as the run's folder, its summary
    and model card the choice."""
    import json

    from paczero.run.release import model_card, read_task

    summary = None
    for entry in sorted(source.iterdir()):
        if entry.name != RunLock.NAME:
            os.replace(entry, out / entry.name)
    shutil.rmtree(source, ignore_errors=True)
    for name in ("run.json", "summary.json"):
        path = out / name
        if path.exists():
            data = json.loads(path.read_text())
            data.setdefault("config", {})["out_dir"] = cfg.out_dir
            if name == "summary.json":
                data["lr_choice"] = _summary_entry(record)
                summary = data
            atomic_json(path, data)
    model_dir = out / "model"
    if summary is not None and (model_dir / "README.md").exists():
        (model_dir / "README.md").write_text(model_card(summary, read_task(model_dir)))


def format_choice(record: dict[str, Any], out_dir: str = ".") -> list[str]:
    """The table of the candidates, the choice and the privacy of the whole choice, as printed."""
    lines = [f"lr choice, {record['cost']}; chosen by {RULE}:",
             f"  {'lr':>9}  {'dev loss':>9}  {'dev acc':>8}  {'seconds':>8}"]
    for i, row in enumerate(record["candidates"]):
        loss, acc = score({"dev": row["dev"]})
        secs = "private" if row["seconds"] is None else f"{row['seconds']:.1f}"
        mark = "*" if i == record["chosen"]["index"] else " "
        lines.append(f"{mark} {row['lr']:>9g}  {loss:>9.4f}  {acc:>8.4f}  {secs:>8}")
    lines.append(f"chosen: lr {record['chosen']['lr']:g}, released as the run in {out_dir}; the others in "
                 f"{out_dir}/{CANDIDATES_DIR}/, this table in {out_dir}/{CHOICE_FILE}")
    lines.append(record["privacy"]["text"])
    return lines


def train_or_choose(cfg: TrainConfig, lr_flag: Any, train_fn: Callable[..., dict]) -> dict[str, Any]:
    """``paczero train``'s hook: one run, or the choice among the values ``--lr`` names."""
    lrs = candidates(cfg, lr_flag)
    return train_fn(cfg) if lrs is None else choose_lr(cfg, lrs, train_fn)
