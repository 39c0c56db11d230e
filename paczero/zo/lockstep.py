"""Lock-step evaluation: module forwards rerouted for a block, and jobs run as greenlets that share z.

Uncached, while a block is open the forward of every module that owns trained
parameters is rerouted (:meth:`Lockstep._evaluating`): it evaluates the module
with the perturbed tensors (:mod:`.layers`), never writing to the parameter.
With several jobs (:meth:`paczero.zo.perturb.Perturber.evaluate`), the jobs run
as greenlets on the calling thread; each parks at every rerouted module, and
when all have arrived the module's z is drawn *once* and the module is
evaluated for every job at its own scale (:meth:`Lockstep._lockstep`). Each job
keeps its own micro-batch shape, so its arithmetic, and result, are unchanged.

Why the forward is rerouted rather than hooked: a forward hook runs after the
module's own forward (it can replace the output, not skip the product with the
stored weights), and ``torch.func.functional_call`` or a parametrization swaps
in whole perturbed tensors, which is what the cached path does
(:meth:`paczero.zo.perturb.Perturber.perturbed`) and what full fine-tuning of a
large model cannot afford: rerouted, one module's perturbed tensor exists at
a time (a Linear too big for that is evaluated a block of output rows at a
time, an embedding perturbs only the rows it looks up), and the lock-step jobs can meet at the module to share one
draw of z. The rerouting lasts one block and is undone on exit.
"""
from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import contextmanager

import torch
from greenlet import greenlet


class Lockstep:
    """The rerouting and the lock-step schedule (a mixin of :class:`paczero.zo.perturb.Perturber`)."""

    @contextmanager
    def _evaluating(self, step: int, k: int, modules: list | None = None, rows: bool = False):
        """Route the forward of every owner module (or of ``modules``) through :meth:`_evaluate_owner` for
        the block; ``rows``: a cached block's embeddings perturbed by looked-up rows whatever their size."""
        if self._open_block is not None:
            raise RuntimeError("perturbed blocks do not nest")
        self._open_block = (int(step), int(k))
        self._block_values = {} if rows else None
        patched = []
        try:
            for module, own in self._owner_modules if modules is None else modules:
                had = "forward" in module.__dict__
                inner = module.forward
                module.forward = self._rerouted(module, own, inner, wrapped=had, rows=rows)
                patched.append((module, had, inner))
            yield
        finally:
            self._open_block = None
            self._scale = None
            self._block_values = None
            self._owner_depth = 0
            for module, had, inner in patched:
                if had:
                    module.forward = inner
                else:
                    del module.forward

    def _rerouted(self, module: torch.nn.Module, own: list[torch.nn.Parameter], inner: Callable,
                  wrapped: bool, rows: bool = False) -> Callable:
        """The forward of one owner module inside a block: a lock-step member parks at it, any other
        caller evaluates it at once at the current scale."""
        path = None  # None: the generic path (every perturbed tensor swapped in for the module's own forward)
        if not wrapped:  # a forward already wrapped (accelerate's device hooks) must run as it is
            big = max(p.numel() for p in own) > self._big_limit(own[0].device)  # a Linear's weight, not + bias
            if type(module).forward is torch.nn.Linear.forward and own[0] is module.weight:
                path = self._linear_big if big and not rows else self._linear  # rows: from the cached z
            elif (big or rows) and type(module).forward is torch.nn.Embedding.forward \
                    and module.max_norm is None and len(own) == 1:
                path = self._embedding
        entry = (module, own, inner, path)

        def forward(*args, **kwargs):
            if self._members and greenlet.getcurrent() in self._members:
                return self._hub.switch((entry, args, kwargs))  # park until the whole group is here
            return self._evaluate_now(entry, args, kwargs)

        return forward

    def _lockstep(self, jobs: list[tuple[float, Callable[[], object]]]) -> list:
        """Run the jobs as greenlets (one OS thread, so torch's own threads are undisturbed).

        A job parks when it calls a module that owns trained parameters; when
        every parked job waits at the same module (the usual case: the same
        model on other micro-batches or the other sign), that module is
        evaluated for all of them from one draw of its z, and they resume in
        order. Jobs that wait at different modules (data-dependent routing) are
        served group by group, so the result never depends on the grouping.
        """
        hub = greenlet.getcurrent()
        members = []
        for _, fn in jobs:
            g = greenlet(run=fn, parent=hub)
            g.gr_context = contextvars.copy_context()
            members.append(g)
        parked: dict[int, tuple] = {}
        results: list = [None] * len(jobs)

        def resume(j: int, value=None) -> None:
            message = members[j].switch(value) if members[j] else members[j].switch()
            if members[j].dead:
                results[j] = message
            else:
                parked[j] = message

        self._hub, self._members = hub, set(members)
        try:
            for j in range(len(jobs)):
                resume(j)
            while parked:
                entry = parked[min(parked)][0]
                group = [j for j in sorted(parked) if parked[j][0] is entry]
                calls = [(jobs[j][0], *parked.pop(j)[1:]) for j in group]
                for n, out in self._evaluate_owner(entry, calls):  # each job resumes as soon as its output exists
                    resume(group[n], out)
                    del out
                del calls
        except BaseException:
            for g in members:
                if g:  # started and parked: unwind it (GreenletExit)
                    g.throw()
            raise
        finally:
            self._hub, self._members = None, set()
        return results

    def _evaluate_owner(self, entry: tuple, calls: list):
        """One owner module evaluated for ``calls = [(scale, args, kwargs), ...]``, z drawn once.

        A generator of ``(position in calls, output)``: the lock-step hub resumes each
        job as soon as its output exists, so at most one job's output is held here
        (entries of ``calls`` are cleared as they are served). Calls are served
        scale by scale, so each perturbed tensor is formed once per scale.
        """
        module, own, inner, path = entry
        step, k = self._open_block
        self._owner_depth += 1
        try:
            if path is not None and all(len(a) == 1 and not kw for _, a, kw in calls):
                calls[:] = [(s, a[0]) for s, a, _ in calls]
                yield from path(module, step, k, calls)
            else:
                yield from self._generic(own, inner, step, k, calls)
        finally:
            self._owner_depth -= 1

    def _evaluate_now(self, entry: tuple, args: tuple, kwargs: dict):
        """An owner module called outside lock-step (or inside another owner): evaluated at once."""
        out = None
        for _, out in self._evaluate_owner(entry, [(self._scale, args, kwargs)]):
            pass
        return out
