"""How far a run's config travels: the rooms of paczero that ``train()`` calls with it, in order.

A tiny run (``tiny-llama``, LoRA, the demo set, 2 steps) is traced with ``sys.setprofile``; every call of a
paczero function that receives the run's config (a ``TrainConfig`` argument, or an object holding it as
``.cfg``: the run's state, its setup) is recorded with its room: its module
(``run.build``, ``tasks.split``, ``train``, ...). Consecutive calls in one room
are one *stay*; a stay in a room the walk has already left is a *return*. Few returns: the prelude, the loop and
the finish each live in one place, and a reader follows the config without going back and forth.

    python benchmarks/config_walk.py            # stays, rooms, returns; --show prints the walk
"""
from __future__ import annotations

import argparse
import sys
import tempfile


def walk(mechanism: str = "pac-zpl") -> list[str]:
    """The rooms, in call order, of the paczero functions a tiny run's ``train()`` calls with a TrainConfig."""
    from paczero.config import TrainConfig
    from paczero.train import train

    rooms: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("paczero."):
            return
        if any(isinstance(v, TrainConfig) or isinstance(getattr(v, "cfg", None), TrainConfig)
               for v in frame.f_locals.values()):
            rooms.append(module.removeprefix("paczero."))

    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(model="tiny-llama", task="demo", data="demo", track="lora", n_train=8, n_dev=4, n_test=4,
                          mechanism=mechanism, num_subsets=4, steps=2, eval_every=2, private_seed=0, dtype="fp32",
                          progress=False, device="cpu", out_dir=f"{out}/run")
        sys.setprofile(profile)
        try:
            train(cfg, log=lambda *a: None)
        finally:
            sys.setprofile(None)
    return rooms


def stays(rooms: list[str]) -> list[str]:
    """Consecutive calls in one room merged: the walk's stays."""
    return [r for i, r in enumerate(rooms) if i == 0 or rooms[i - 1] != r]


def returns(walked: list[str]) -> int:
    """Stays in a room the walk had already left."""
    seen, count = set(), 0
    for room in walked:
        count += room in seen
        seen.add(room)
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanism", default="pac-zpl")
    ap.add_argument("--show", action="store_true", help="print the walk, a stay a line")
    args = ap.parse_args()
    walked = stays(walk(args.mechanism))
    if args.show:
        print("\n".join(walked))
    print(f"{len(walked)} stays in {len(set(walked))} rooms, {returns(walked)} returns to a room already left")


if __name__ == "__main__":
    main()
