"""Peak memory of a training or an inference phase, each in a fresh process (resident and live bytes)."""
from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict

from paczero.bench.harness import BenchConfig, Harness, dpsgd_runner


def _rss_peak_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the resident high-water mark (Linux >= 4.0)
        return True
    except OSError:
        return False


def _rss_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _make_resident(model) -> None:
    """Read every parameter and buffer once, so that both memory phases start with all weights resident.

    ``from_pretrained`` maps a safetensors file lazily: an inference pass makes
    resident only the pages it reads (of an embedding, the rows of the tokens it
    looks up), while full fine-tuning writes every row. Without this, RSS charged
    the untouched rows to training (≈ 90 MiB of SmolLM2's embedding at N = 1000;
    docs/performance.md).
    """
    import torch

    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.numel():
                float(t.data.sum())


def live_peak_bytes(fn: Callable[[], object]) -> int:
    """Run ``fn`` and return the highest net sum of CPU tensor bytes it had allocated at any moment.

    The allocations and frees are the ``[memory]`` events of torch's profiler (``profile_memory``),
    which records the calling thread's tensors (greenlets included): worker threads' scratch is
    not seen (the uncached update's chunks of z, 64 KiB each). The profiler does not record the
    free of a tensor allocated before ``fn``, so such frees never lower the sum and the figure errs
    high; the caller adds what was live before (the weights) to get a peak of live bytes.
    """
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError as e:  # the profiler's internals moved: say so rather than report nothing
        raise RuntimeError(f"live memory: this torch's profiler has no kineto_results ({e})") from None
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    cur = peak = 0
    for _, nbytes in deltas:
        cur += nbytes
        peak = max(peak, cur)
    return peak


def _tensor_bytes(model) -> int:
    """Bytes of the distinct storages of a model's parameters and buffers."""
    seen: dict[int, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _memory_child(cfg_dict: dict, phase: str, live: bool = False) -> dict:
    import torch

    cfg = BenchConfig(**cfg_dict)
    h = Harness(cfg)
    cuda = str(cfg.device).startswith("cuda")
    _make_resident(h.model)
    gc.collect()

    def work():
        if phase == "inference":
            for _ in range(2):
                h.floor_pass()
        elif phase == "dp-sgd":  # a DP-SGD step over the same rows (paczero/bench/first_order.py)
            step = dpsgd_runner(h)
            step(0), step(1)
        else:
            h.steps(cfg.num_subsets, 1)

    if live:
        base = _tensor_bytes(h.model)
        peak = base + live_peak_bytes(work)
        return {"peak_bytes": int(peak), "before_bytes": int(base), "kind": "live tensor bytes (torch profiler)"}
    base = torch.cuda.memory_allocated() if cuda else _rss_peak()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    reset = cuda or _rss_peak_reset()
    work()
    peak = torch.cuda.max_memory_allocated() if cuda else _rss_peak()
    return {"peak_bytes": int(peak), "before_bytes": int(base), "peak_reset": bool(reset),
            "kind": "cuda max_memory_allocated" if cuda else "RSS high-water (VmHWM)"}


def memory_phase(cfg: BenchConfig, phase: str, live: bool = False) -> dict:
    """Peak memory of ``phase`` ("inference": two floor passes; "train": two ZO steps; "dp-sgd": two DP-SGD steps
    over the same rows) in a fresh process
    (``live``: of live tensor bytes, see :func:`live_peak_bytes`)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:  # joined, not terminated, on exit
        return pool.submit(_memory_child, asdict(cfg), phase, live).result()
