"""Data parallelism: 2 gloo processes give the single-process transcript and weights, bit for bit."""
import json
import os

import numpy as np
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from paczero.bench import free_port
from paczero.config import TrainConfig
from paczero.distributed import shard_batches, shard_plan


class _B:
    def __init__(self, tokens, index):
        self.num_tokens, self.index = tokens, np.asarray(index)


def test_shard_plan_balances_tokens_and_covers_every_batch():
    batches = [_B(t, [i]) for i, t in enumerate([100, 90, 50, 40, 30, 10])]
    plan = shard_plan(batches, 2)
    assert sorted(b for p in plan for b in p) == list(range(6))
    loads = [sum(batches[b].num_tokens for b in p) for p in plan]
    assert abs(loads[0] - loads[1]) <= 20  # LPT: within the last batches placed
    assert all(p == sorted(p) for p in plan)
    assert shard_batches(batches, 0, 1) == batches
    assert shard_plan(batches[:1], 3)[1:] == [[], []]  # more ranks than batches: idle ranks


def _config(out_dir: str) -> TrainConfig:
    return TrainConfig(model="tiny-llama", track="ft", task="demo", n_train=16, n_dev=8, n_test=8, steps=4,
                       mechanism="pac-mi", mi_budget=0.5, num_subsets=8, lr=1e-2, mu=1e-2, token_budget=64,
                       eval_every=2, checkpoint_every=2, eval_zero_shot=False, progress=False, seed=3,
                       private_seed=1234, out_dir=out_dir, device="cpu")


def _rank(rank: int, world: int, port: int, out_dir: str, torch_directions_rank: int = -1) -> None:
    import torch.distributed as tdist

    import paczero.subsets
    import paczero.train

    torch.set_num_threads(1)
    if rank == torch_directions_rank:  # this rank's z from torch's generator, the others' from the kernel
        os.environ["PACZERO_TORCH_DIRECTIONS"] = "1"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    if rank:  # the other ranks must never build a mechanism nor draw a secret
        def forbidden(*a, **k):
            raise AssertionError("a rank other than 0 touched private state")
        paczero.train.make_mechanism = forbidden
        paczero.subsets.private_generator = forbidden
    try:
        out = paczero.train.train(_config(out_dir), log=lambda *a: None)
        assert ("privacy" in out) == (rank == 0)
    finally:
        tdist.destroy_process_group()


def _transcript(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "log.jsonl"))]
    for r in rows:
        r.pop("seconds")
    return rows


def test_two_processes_match_one(tmp_path):
    from paczero.train import train

    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels as each rank
    try:
        train(_config(single), log=lambda *a: None)
    finally:
        torch.set_num_threads(threads)
    mp.start_processes(_rank, args=(2, free_port(), multi), nprocs=2, start_method="spawn", join=True)

    a, b = _transcript(single), _transcript(multi)
    assert len(a) == 4 and a == b
    assert any(r["branch"] == "noised" for r in a) or any(r["branch"] == "unanimous" for r in a)
    wa, wb = load_file(f"{single}/selected.safetensors"), load_file(f"{multi}/selected.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [json.loads(x) for x in open(f"{single}/evals.jsonl")] == [json.loads(x) for x in open(f"{multi}/evals.jsonl")]
    assert not os.path.exists(os.path.join(multi, "rank1"))  # nothing but rank 0's files
    from paczero.cpu_directions import KERNEL_SOURCE
    assert json.load(open(f"{multi}/run.json"))["directions"] == KERNEL_SOURCE


def test_ranks_that_would_draw_other_directions_refuse_to_start(tmp_path):
    """A rank whose z comes from another generator (say its C compiler failed) stops every rank before the
    first step, naming the difference; negative control: the same launch with agreeing ranks trains."""
    import pytest

    with pytest.raises(Exception, match="disagree on directions"):
        mp.start_processes(_rank, args=(2, free_port(), str(tmp_path / "a"), 1), nprocs=2, start_method="spawn",
                           join=True)
    assert not os.path.exists(tmp_path / "a" / "log.jsonl") or not open(tmp_path / "a" / "log.jsonl").read()
    mp.start_processes(_rank, args=(2, free_port(), str(tmp_path / "b"), -1), nprocs=2, start_method="spawn",
                       join=True)
    assert len(_transcript(tmp_path / "b")) == 4
