"""The regime map: how often a public direction is unanimous, for every universe size N and subset count M.

PAC-ZPL releases the secret subset's sign only when all M candidate subsets agree (Algorithm 1: exact
unanimity, :func:`paczero.privacy.subsets.subset_signs`); on every other step it releases a coin. How often that
happens decides what a run learns, and it moves with N (the subsets' means get closer as they grow) and M
(more subsets, more chances to disagree). :func:`compute_scalars` evaluates a model (the base model, or a
finished run's released weights) once along each of K public directions: the per-example two-point scalars
of :func:`paczero.zo.two_point_scalars` over a universe of examples, the engine training uses, stored in
``OUT/scalars.npz`` one direction at a time (an interrupted computation resumes). :func:`unanimity_map` then
draws, for each (N, M) of a grid, subsamples of N examples and a balanced design of M subsets
(:func:`paczero.privacy.subsets.balanced_design`), clips the scalars as training does and counts the directions on
which the M subset signs are all equal: no forward pass, so another grid costs seconds.

Direction j is the one a run with the config's public ``seed`` draws at step j (direction index 0),
evaluated at the fixed weights. ``paczero regime OUT ...`` writes the scalars, ``regime.csv``,
``regime.md`` and ``regime.png``.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from paczero.config import ConfigError, TrainConfig

__all__ = ["SCALARS", "DEFAULT_N_GRID", "DEFAULT_M_GRID", "compute_scalars", "default_n_grid", "read_scalars",
           "regime_command", "unanimity_map", "write_map"]

SCALARS = "scalars.npz"
DEFAULT_N_GRID = (64, 128, 256, 512, 1000)
DEFAULT_M_GRID = (16, 32, 64, 128)
#: the settings that make two sets of scalars comparable: stored with them, checked on a resume
_KEYS = ("model", "track", "lora_r", "lora_alpha", "lora_targets", "dtype", "task", "data", "columns", "template",
         "verbalizer", "labels", "objective", "max_length", "n_train", "data_seed", "seed", "mu", "clip")


def default_n_grid(universe: int) -> list[int]:
    """The N of :data:`DEFAULT_N_GRID` up to the universe's size, and the universe's size."""
    return sorted({n for n in DEFAULT_N_GRID if n <= universe} | {universe})


def check_grid(n_grid: Sequence[int], m_grid: Sequence[int], universe: int | None = None) -> None:
    """One clear line for a grid that cannot be drawn: N < 2 or above the universe, M odd or < 2."""
    for n in n_grid:
        if n < 2 or (universe is not None and n > universe):
            raise ConfigError(f"every N of the grid must be >= 2 and at most the universe's {universe} examples; "
                              f"got {n}")
    for m in m_grid:
        if m < 2 or m % 2:
            raise ConfigError(f"every M of the grid must be even and >= 2 (a balanced design); got {m}")


#: where the data and the weights lie: stored, not compared (their contents are, by digest), so that a moved file resumes
_LOCATIONS = ("data", "weights")


def _meta(cfg: TrainConfig, weights: str, examples: list) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(examples, sort_keys=True, default=str).encode()).hexdigest()
    meta = {**{k: getattr(cfg, k) for k in _KEYS}, "weights": weights, "examples_sha256": digest}
    if weights != "base model":
        meta["weights_sha256"] = hashlib.sha256(Path(weights).read_bytes()).hexdigest()
    return meta



def read_scalars(out: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """The stored scalars ``[K, N]`` and their settings (``meta``: the config's keys, the weights, the seconds
    each direction took)."""
    path = Path(out) / SCALARS
    try:
        with np.load(path, allow_pickle=False) as f:
            return f["scalars"].copy(), json.loads(str(f["meta"]))
    except (OSError, KeyError, ValueError) as e:
        raise ConfigError(f"{str(path)!r} holds no readable regime scalars ({e.__class__.__name__})") from None


def _write(out: Path, g: np.ndarray, meta: dict) -> None:
    tmp = out / f".{SCALARS}.tmp{os.getpid()}.npz"
    np.savez_compressed(tmp, scalars=g, meta=np.array(json.dumps(meta, default=str)))
    os.replace(tmp, out / SCALARS)


def _universe(cfg: TrainConfig) -> list:
    """The first ``n_train`` examples the data seed draws from the config's data (no dev or test is drawn)."""
    from paczero.tasks import load_splits

    train, _, _ = load_splits(cfg.task, source=cfg.data, n_train=cfg.n_train, n_dev=0, n_test=0, seed=cfg.data_seed,
                              columns=cfg.columns, labels=cfg.labels)
    if len(train) < 2:
        raise ConfigError(f"the universe needs at least 2 examples, got {len(train)}")
    return train


def compute_scalars(cfg: TrainConfig, out: Path, directions: int, *, run: Path | None = None,
                    settings_args: Sequence[str] = (), log: Callable[[str], None] = print) -> tuple[np.ndarray, dict]:
    """The scalars ``[directions, n_train]`` of the config's model (``run``: that finished run's released weights,
    ``RUN/selected.safetensors``) along directions 0 .. K-1, written to ``OUT/scalars.npz`` after each one.
    What is stored there for the same settings is kept and continued; other settings are refused.
    ``settings_args``: the command-line arguments that gave the settings, stored to name the command."""
    from paczero.run.build import build, environment, load_trainable
    from paczero.machine.hardware import fit_to_machine, omp_threads
    from paczero.machine.thread_share import ThreadShare
    from paczero.models import trainable_parameters
    from paczero.zo import Perturber, two_point_scalars

    cfg = fit_to_machine(cfg)  # dtype auto and an unset mu resolved, as a run resolves them
    weights = "base model" if run is None else str(Path(run).resolve() / "selected.safetensors")
    if run is not None and not Path(weights).is_file():
        raise ConfigError(f"run {str(run)!r} is not finished (no selected.safetensors)")
    examples = _universe(cfg)
    meta = _meta(cfg, weights, examples)
    named = {"settings_args": list(settings_args)}  # how the settings were given: stored, not compared
    out.mkdir(parents=True, exist_ok=True)
    g = np.zeros((0, len(examples)))
    seconds: list[float] = []
    stored: dict[str, Any] = {}
    if (out / SCALARS).exists():
        g, stored = read_scalars(out)
        differ = [k for k in meta if k not in _LOCATIONS
                  and json.dumps(stored.get(k), default=str) != json.dumps(meta[k], default=str)]
        if differ:
            raise ConfigError(f"{str(out / SCALARS)!r} holds scalars of other settings ({differ[0]}: "
                              f"{stored.get(differ[0])!r}, not {meta[differ[0]]!r}); choose another folder")
        seconds = list(stored.get("seconds", []))
    if len(g) >= directions:
        return g[:directions], {**stored, **meta, **named, "seconds": seconds}
    setup = build(cfg, examples=(examples, [], []))
    params = trainable_parameters(setup.model, cfg.track)
    if run is not None:
        from safetensors.torch import load_file

        load_trainable(params, load_file(weights))
    perturber = Perturber(setup.model, params, cfg.seed, lockstep=cfg.lockstep_batches,
                          token_budget=cfg.token_budget)
    batches = setup.task.make_batches(setup.universe, token_budget=cfg.token_budget)
    env = environment(setup.device)
    meta.update(named, directions_generator=perturber.directions, date=time.strftime("%Y-%m-%d", time.gmtime()),
                machine=f"{env['hardware']}, torch {env['torch']}")
    try:
        with ThreadShare(cfg.threads or omp_threads()) as share:  # the cores shared with paczero trainings beside it
            for j in range(len(g), directions):
                share.refresh()
                t0 = time.perf_counter()
                row, _ = two_point_scalars(perturber, j, 1, cfg.mu, batches,
                                           lambda b: setup.task.losses(setup.model, b), len(setup.universe),
                                           setup.device)
                seconds.append(time.perf_counter() - t0)
                g = np.concatenate([g, row])
                _write(out, g, {**meta, "seconds": seconds})
                log(f"direction {j + 1}/{directions}: {seconds[-1]:.1f} s ({len(setup.universe)} examples, "
                    f"2 forwards each)")
    finally:
        perturber.remove()
    return g, {**meta, "seconds": seconds}


def unanimity_map(g: np.ndarray, n_grid: Sequence[int], m_grid: Sequence[int], *, clip: float | None = None,
                  draws: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """For each (N, M): over ``draws`` draws of N examples of the universe (without replacement) and a balanced
    design of M subsets, the share of directions whose M subset signs (of the clipped scalars) are all equal;
    its standard error over directions (each direction's share over the draws); and the mean agreement (the
    larger side's share of the M signs). The draws come from a public generator seeded with ``seed``."""
    from paczero.privacy.subsets import balanced_design, subset_signs
    from paczero.zo import stability_clip

    k, universe = g.shape
    check_grid(n_grid, m_grid, universe)
    rng = np.random.default_rng(seed)
    clipped = stability_clip(np.asarray(g, dtype=np.float64), clip)
    rows = []
    for n in n_grid:
        for m in m_grid:
            unanimous = np.zeros((draws, k))
            agreement = np.zeros((draws, k))
            for d in range(draws):
                idx = rng.choice(universe, size=n, replace=False)
                signs = subset_signs(clipped[:, idx], balanced_design(n, m, rng=rng)).astype(np.int64)
                plus = (signs == 1).sum(axis=1)
                unanimous[d] = (plus == 0) | (plus == m)
                agreement[d] = np.maximum(plus, m - plus) / m
            per_direction = unanimous.mean(axis=0)
            se = float(per_direction.std(ddof=1) / np.sqrt(k)) if k > 1 else float("nan")
            rows.append({"n": n, "m": m, "directions": k, "draws": draws, "unanimous": float(per_direction.mean()),
                         "unanimous_se": se, "agreement": float(agreement.mean())})
    return rows


def write_map(out: Path, rows: list[dict], meta: dict, command: str) -> list[Path]:
    """``regime.csv`` (every figure), ``regime.md`` (the unanimous share, N by M, with the settings and the
    command) and ``regime.png`` (share against N, one line per M)."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "regime.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    ns, ms = sorted({r["n"] for r in rows}), sorted({r["m"] for r in rows})
    at = {(r["n"], r["m"]): r for r in rows}
    cell = lambda r: f"{100 * r['unanimous']:.1f} ± {100 * r['unanimous_se']:.1f}"  # noqa: E731
    table = ["| N \\ M | " + " | ".join(map(str, ms)) + " |", "|---" * (len(ms) + 1) + "|"]
    table += [f"| {n} | " + " | ".join(cell(at[n, m]) for m in ms) + " |" for n in ns]
    r0, secs = rows[0], meta.get("seconds") or []
    cost = f"; {np.median(secs):.1f} s per direction (median)" if secs else ""
    where = f" Computed {meta['date']} on {meta['machine']}." if meta.get("machine") else ""
    text = [f"Share of unanimous directions (%, ± standard error over directions): {r0['directions']} public "
            f"directions, {r0['draws']} draws of the N examples and of the balanced design of M subsets per cell.",
            "", *table, "",
            f"Model: {meta['model']} ({meta['track']}, {meta['dtype']}), weights: {meta['weights']}; data: "
            f"{meta['data']} ({meta['task']}, universe {meta['n_train']}, data seed {meta['data_seed']}); mu "
            f"{meta['mu']:g}, clip {meta['clip']}, public seed {meta['seed']}{cost}.{where}", "",
            f"Command: `{command}`", ""]
    (out / "regime.md").write_text("\n".join(text))
    return [out / "regime.csv", out / "regime.md", _plot(out / "regime.png", rows, meta)]


def _plot(path: Path, rows: list[dict], meta: dict) -> Path:
    from paczero.experiments.report.plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for m in sorted({r["m"] for r in rows}):
        pts = sorted((r["n"], 100 * r["unanimous"], 100 * r["unanimous_se"]) for r in rows if r["m"] == m)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    label=f"M = {m}")
    ax.set_xscale("log", base=2)
    ns = sorted({r["n"] for r in rows})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("N (universe size, log scale)")
    ax.set_ylabel("unanimous directions %")
    where = "base model" if meta["weights"] == "base model" else "trained model"
    ax.set_title(f"Unanimity by N and M: {meta['model']}, {where}, {rows[0]['directions']} directions", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def regime_command(ns) -> int:
    """``paczero regime``: the scalars (computed, resumed or read from OUT) and the map; ``ns``: its parsed flags."""
    import shlex
    import sys

    from paczero.flags import config_from_args

    out = Path(ns.out).expanduser()
    flags = {k: v for k, v in vars(ns).items() if k in TrainConfig.field_names()}
    check_grid(ns.n_grid or [], ns.m_grid)
    if ns.draws < 1 or (ns.directions is not None and ns.directions < 1):
        raise ConfigError("--draws and --directions must be >= 1")
    if ns.run and (ns.recipe or ns.config):
        raise ConfigError("--run brings its own config: give flags to change it, not --recipe or --config")
    settings = [*(["--run", ns.run] if ns.run else []), *(["--recipe", ns.recipe] if ns.recipe else []),
                *(["--config", ns.config] if ns.config else [])]
    for k, v in flags.items():
        flag = "--" + k.replace("_", "-")
        settings += ([flag if v else "--no-" + flag[2:]] if isinstance(v, bool) else
                     [flag, json.dumps(v) if isinstance(v, (dict, list)) else str(v)])
    if not settings:  # the map again, from the scalars OUT holds
        if not (out / SCALARS).exists():
            raise ConfigError(f"{str(out)!r} holds no {SCALARS}: give the model and data (--recipe, --config or --run)")
        g, meta = read_scalars(out)
        g = g[:ns.directions] if ns.directions else g
        n_grid, settings = ns.n_grid or default_n_grid(g.shape[1]), meta.get("settings_args", [])
    else:
        if ns.run:
            from paczero.audit.membership import _load_config

            cfg = TrainConfig.from_dict({**_load_config(Path(ns.run)).to_dict(), **flags}, source=ns.run).validate()
        else:
            cfg = config_from_args(ns, partial_sizes=False)  # U alone: no dev or test
        n_grid = ns.n_grid or default_n_grid(cfg.n_train)
        check_grid(n_grid, ns.m_grid, cfg.n_train)  # before any forward
        g, meta = compute_scalars(cfg, out, ns.directions or 16, run=Path(ns.run) if ns.run else None,
                                  settings_args=settings, log=lambda line: print(line, file=sys.stderr))
    rows = unanimity_map(g, n_grid, ns.m_grid, clip=meta["clip"], draws=ns.draws)
    command = shlex.join(["paczero", "regime", ns.out, *settings, "--directions", str(len(g)), "--n-grid",
                          *map(str, n_grid), "--m-grid", *map(str, ns.m_grid), "--draws", str(ns.draws)])
    print("\n".join(map(str, write_map(out, rows, meta, command))))
    return 0
