"""``paczero bench --host``: the host time of a step, the part of it that is not the model's own arithmetic.

For PAC-ZPL, MeZO, DP-SGD and AdamW, one step each over the same N rows (the universe; DP-SGD at sample rate 1,
MeZO and AdamW on the whole universe), on the model the bench loaded. Each step's wall time is split in two:

* ``model_s``: the time inside the model's forwards (the task's per-example losses) and, for the first-order
  steps, inside the backwards (``Tensor.backward``). While any forward of the step is running (the lock-step
  jobs of an uncached step interleave theirs) the clock counts model time once; on CUDA each such interval
  starts and ends with ``torch.cuda.synchronize()``, so it holds the device's work too;
* ``host_s = step_s - model_s``: everything else the step does: drawing z, forming the perturbed tensors and
  swapping them in, the update, the micro-batch and direction loops, the two-point scalars' bookkeeping, the
  mechanism's release, the first-order steps' gradient sums, noise and optimizer.

Work done inside a forward counts as model time: the model's own Python (transformers' module calls), a
rerouted module's perturbation on the uncached path, Opacus's per-example hooks. On a tiny model at N = 1000
the model's arithmetic is small and ``host_s`` is what paczero's step adds around the forwards; it is measured
directly, not as a difference of two noisy step times. ``host_cpu_s`` is the same split in process CPU time.

This module uses only interfaces that are older than it (:class:`~paczero.bench.harness.Harness`,
:func:`paczero.zo.zo_step`, the first-order steps), so ``benchmarks/host_time.py`` can time an older
checkout's step with it, beside the current one, in one run.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager

#: the steps timed, in the order of the table
HOST_METHODS = ("pac-zpl", "mezo", "dp-sgd", "adamw")


class ModelClock:
    """Wall and process CPU time spent inside the model's forwards (and backwards), intervals merged.

    ``wrap(loss_fn)`` times every call of ``loss_fn``; :meth:`backwards` times ``Tensor.backward`` while
    it is open. Nested or interleaved calls (lock-step greenlets) count once: the clock runs from the
    first entry to the last exit.
    """

    def __init__(self, cuda: bool = False):
        self.cuda = cuda
        self.wall = self.cpu = 0.0
        self._depth = 0
        self._t0 = self._c0 = 0.0

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def enter(self) -> None:
        if self._depth == 0:
            self._sync()
            self._t0, self._c0 = time.perf_counter(), time.process_time()
        self._depth += 1

    def leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._sync()
            self.wall += time.perf_counter() - self._t0
            self.cpu += time.process_time() - self._c0

    def reset(self) -> None:
        self.wall = self.cpu = 0.0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            self.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        return timed

    @contextmanager
    def backwards(self):
        """``Tensor.backward`` timed as model time while the block is open (restored after)."""
        import torch

        original = torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            self.enter()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self.leave()

        torch.Tensor.backward = backward
        try:
            yield
        finally:
            torch.Tensor.backward = original


def _timed(h, clock: ModelClock, body: Callable[[], None]) -> dict:
    clock.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    body()
    h.sync()
    step_s, step_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return {"step_s": step_s, "model_s": clock.wall, "host_s": step_s - clock.wall,
            "step_cpu_s": step_cpu_s, "host_cpu_s": step_cpu_s - clock.cpu}


def zeroth_order_runner(h, mechanism: str, clock: ModelClock) -> Callable[[int], dict]:
    """PAC-ZPL's or MeZO's step (:func:`paczero.zo.zo_step`, as the training loop calls it) over the universe."""
    from dataclasses import replace

    from paczero.run.build import step_batches
    from paczero.run.distributed import SingleProcess
    from paczero.zo import zo_step

    c = h.cfg
    h.get_perturber()
    saved, h.cfg = h.cfg, replace(h.cfg, mechanism=mechanism)
    try:
        mech = h.mechanism(c.num_subsets, c.n)
    finally:
        h.cfg = saved
    ranks = SingleProcess()
    loss_fn = clock.wrap(lambda b: h.task.losses(h.model, b))

    def release(clipped):
        return [r.coef for r in mech.step(clipped)], c.lr

    def one_step(step: int) -> dict:
        def body():
            batches, rows = step_batches(h.task, h.universe, h.batches, mech.batch_indices(c.n), c.token_budget)
            zo_step(step, batches, rows, perturber=h.perturber, ranks=ranks, loss_fn=loss_fn,
                    num_directions=c.num_directions, mu=c.mu, clip=None, weight_decay=0.0, device=c.device,
                    release=release)

        return _timed(h, clock, body)

    return one_step


def first_order_runner(h, method: str, clock: ModelClock, steps: int):
    """DP-SGD's step (sample rate 1) or AdamW's (the whole universe) over the universe: the step as a function
    of the step number, and a function that detaches it (Opacus's hooks, the gradients) from the model."""
    import torch

    from paczero.bench.harness import DPSGD_CLIP, DPSGD_DELTA, DPSGD_EPSILON, DPSGD_LR
    from paczero.fo.adamw_step import PlainFirstOrder, adamw_step
    from paczero.fo.dpsgd_step import dpsgd_step, grad_sample_mode, wrap
    from paczero.mechanisms.dpsgd import DPSGD
    from paczero.mechanisms.reference import NonPrivateAdamW
    from paczero.models import trainable_parameters
    from paczero.run.build import step_batches

    c = h.cfg
    params = trainable_parameters(h.model, c.track)
    loss_fn = clock.wrap(lambda b: h.task.losses(h.model, b))
    modes = [(m, m.training) for m in h.model.modules()]  # Opacus sets trained layers to training mode
    if method == "dp-sgd":
        fo = wrap(h.model, params, lr=DPSGD_LR, weight_decay=0.0, clip=DPSGD_CLIP,
                  mode=grad_sample_mode(h.model, params, c.track))
        mech = DPSGD(c.n, DPSGD_EPSILON, DPSGD_DELTA, steps + 2, 1.0, DPSGD_CLIP, seed=c.seed)
        step_fn = dpsgd_step
    else:
        tensors = [p for _, p in params]
        for p in h.model.parameters():
            p.requires_grad_(any(p is t for t in tensors))
        fo = PlainFirstOrder(torch.optim.AdamW(tensors, lr=DPSGD_LR, weight_decay=0.0), tensors)
        mech = NonPrivateAdamW(None, seed=c.seed)
        step_fn = adamw_step

    def one_step(step: int) -> dict:
        def body():
            batches, _ = step_batches(h.task, h.universe, h.batches, mech.batch_indices(c.n), c.token_budget)
            with clock.backwards():
                step_fn(batches, fo=fo, mechanism=mech, loss_fn=loss_fn, lr=DPSGD_LR, device=c.device)

        return _timed(h, clock, body)

    def close() -> None:
        fo.close()
        for m, training in modes:
            m.train(training)

    return one_step, close


def measure_host(h, steps: int, methods=HOST_METHODS, log=print) -> dict:
    """Per method: the medians over ``steps`` steps after a warm-up of the step, model and host times, wall and
    process CPU, in seconds. PAC-ZPL and MeZO take turns in every round; each first-order method runs its steps
    on its own afterwards (Opacus's hooks, attached for DP-SGD, would slow every other step's forwards)."""
    clock = ModelClock(str(h.cfg.device).startswith("cuda"))
    zo = {m: zeroth_order_runner(h, m, clock) for m in methods if m in ("pac-zpl", "mezo")}
    # every step its own number: the perturber keeps a step's z, and a method that met another's step number
    # would find its z drawn already
    for j, run in enumerate(zo.values()):
        run(j)  # warm-up
    rounds = [{m: run((i + 1) * len(zo) + j) for j, (m, run) in enumerate(zo.items())} for i in range(steps)]
    timings = {m: [r[m] for r in rounds] for m in zo}
    for m in methods:
        if m in ("dp-sgd", "adamw"):
            run, close = first_order_runner(h, m, clock, steps)
            try:
                timings[m] = [run(i) for i in range(steps + 1)][1:]  # the first is a warm-up
            finally:
                close()
    out = {}
    for m in methods:
        out[m] = {key: statistics.median(r[key] for r in timings[m])
                  for key in ("step_s", "model_s", "host_s", "step_cpu_s", "host_cpu_s")}
        log(f"  host {m:8s} step {out[m]['step_s'] * 1e3:8.2f} ms  model {out[m]['model_s'] * 1e3:8.2f} ms  "
            f"host {out[m]['host_s'] * 1e3:7.2f} ms  (cpu {out[m]['host_cpu_s'] * 1e3:7.2f} ms)")
    return out


def host_table(results: list[dict]) -> str:
    """One row per configuration and method: step, model and host milliseconds."""
    head = ("model", "track", "dtype", "N", "method", "step ms", "model ms", "host ms", "host cpu ms")
    rows = []
    for r in results:
        c = r["config"]
        for m, x in r.get("host", {}).items():
            rows.append((c["model"], c["track"], c["dtype"], str(c["n"]), m, f"{x['step_s'] * 1e3:.2f}",
                         f"{x['model_s'] * 1e3:.2f}", f"{x['host_s'] * 1e3:.2f}", f"{x['host_cpu_s'] * 1e3:.2f}"))
    if not rows:
        return ""
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
