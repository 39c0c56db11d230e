"""The step time of a data-parallel run with several processes on one machine."""
from __future__ import annotations

import os
from dataclasses import asdict, replace

from paczero.bench.harness import BenchConfig, Harness, _median


def _dp_child(rank: int, world: int, port: int, cfg_dict: dict, queue) -> None:
    import torch
    import torch.distributed as tdist

    from paczero.run.distributed import DataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(cfg_dict["threads"]))
    cfg = BenchConfig(**cfg_dict)
    cuda = str(cfg.device).startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
        cfg = replace(cfg, device=f"cuda:{rank}")
    tdist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        h = Harness(cfg)
        steps = h.steps(cfg.num_subsets, cfg.steps, ranks=DataParallel())
        if rank == 0:
            queue.put({"world": world, "threads_per_rank": torch.get_num_threads(),
                       "step_s": _median(steps, "step_s"), "scalars_s": _median(steps, "scalars_s")})
    finally:
        tdist.destroy_process_group()


def dp_step_time(cfg: BenchConfig, world: int) -> dict:
    """Median step time of rank 0 in a ``world``-process run on this machine (CPU: cores split evenly)."""
    import torch
    import torch.multiprocessing as tmp

    from paczero.run.distributed import free_port

    threads = max(1, (cfg.threads or torch.get_num_threads()) // world)
    sub = replace(cfg, threads=threads, world=1, scaling=False, memory=False)
    ctx = tmp.get_context("spawn")
    queue = ctx.SimpleQueue()
    tmp.start_processes(_dp_child, args=(world, free_port(), asdict(sub), queue), nprocs=world,
                        start_method="spawn", join=True)
    return queue.get()
