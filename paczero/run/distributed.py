"""Data parallelism over the training universe with ``torch.distributed`` (launched by ``torchrun``).

Every rank holds the whole model and regenerates the same public directions z
from the public seed. At each step

1. rank 0 asks the mechanism which examples to score and announces the step
   (and the subsample, ``None`` for PAC's whole universe) to the others;
2. the micro-batches are split between the ranks, balanced by token count
   (:func:`shard_batches`); each rank computes the two-point scalars of its
   share and :func:`gather_scalars` all-gathers them, so every rank holds the
   full ``[K, N]`` array (N floats per direction, with the per-batch loss sums and a stop request);
3. rank 0 alone runs the mechanism with the private generator and broadcasts
   the release (the K coefficients and the learning rate);
4. every rank applies the identical update.

The other ranks never build a mechanism: no secret index, no private
generator, no posterior exists outside rank 0 (:func:`run_follower` is their whole
loop). Only rank 0 writes logs, checkpoints and the summary.

Before any work the ranks meet (:meth:`DataParallel.agree`): they compare the
settings that shape their computation (every command-line key but the output
folder's, the private seed and the data's path, plus the versions of paczero, torch,
transformers and peft), then their data (the examples and their tokens), then
the generator of z. A rank that found bad input, or ranks that differ, stop
every rank together with one error line per node (exit code 2), instead of
leaving the others waiting in a collective or, worse, training on other
scalars. This matters most across nodes, where each node is launched by its
own command line.

A run is bit-identical to a single-process run with the same seeds when every rank
computes with the same kernels as the single process (same device type and
intra-op thread count: ``torchrun`` sets ``OMP_NUM_THREADS=1`` per rank on
CPU), because each micro-batch is the very tensor the single process would
score and the scalars are moved, never summed.

Launch: ``torchrun --nproc-per-node 2 -m paczero.cli train ...`` (gloo on CPU,
nccl on CUDA, one GPU per rank from ``LOCAL_RANK``); across nodes, the same
command on each node with ``--nnodes``, ``--node-rank`` and the address of
node 0 (docs/distributed.md). A single process is :class:`SingleProcess`, whose
methods pass through.
"""
from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as tdist

from paczero.config import ConfigError

#: how long a rank waits in a collective (rank 0 evaluates and checkpoints while the others wait)
TIMEOUT = datetime.timedelta(hours=2)


#: config keys in which ranks may differ: rank 0's alone (its run folder, its secret), and the data's path
#: (a node may hold its copy elsewhere: the examples and their tokens are compared instead)
UNCOMPARED_KEYS = ("out_dir", "overwrite", "resume", "progress", "private_seed", "data")


class RankStopped(ConfigError):
    """Every rank stops: a rank found bad input, or the ranks differ (see :meth:`DataParallel.agree`).

    ``quiet`` is set on every process but the first of its node (``LOCAL_RANK`` 0), so that each
    node's log holds the error line once."""

    def __init__(self, message: str):
        super().__init__(message)
        self.quiet = int(os.environ.get("LOCAL_RANK", "0")) != 0


def shared_settings(cfg) -> dict:
    """What every rank must hold alike to compute the same scalars: the config but :data:`UNCOMPARED_KEYS`
    (the private seed never leaves rank 0), and the versions of the libraries that compute them."""
    from importlib.metadata import PackageNotFoundError, version

    def _version(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    settings = {k: v for k, v in cfg.to_dict().items() if k not in UNCOMPARED_KEYS}
    settings.update({f"{name} version": _version(name) for name in ("paczero", "torch", "transformers", "peft")})
    return json.loads(json.dumps(settings, default=str))


def _differences(what: str, values: Sequence) -> str:
    """One line naming what differs between the ranks' ``values`` (each rank's value against rank 0's)."""
    def show(v) -> str:
        text = json.dumps(v, default=str)
        return text if len(text) <= 60 else text[:57] + "..."

    ranks = range(len(values))
    if all(isinstance(v, dict) for v in values):
        keys = sorted({k for v in values for k in v if any(w.get(k) != values[0].get(k) for w in values)})
        parts = [f"{k} (" + "; ".join(f"rank {r}: {show(values[r].get(k))}" for r in ranks
                                      if r == 0 or values[r].get(k) != values[0].get(k)) + ")" for k in keys]
        return f"data-parallel ranks disagree on {what}: " + ", ".join(parts)
    return f"data-parallel ranks disagree on {what}: " + "; ".join(
        f"rank {r}: {show(values[r])}" for r in ranks if r == 0 or values[r] != values[0])


def init_from_env(device: str = "auto") -> "SingleProcess | DataParallel":
    """The data-parallel context of this process, from torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``.

    Reuses a process group that is already initialised (and leaves it to its owner: only a group
    initialised here is destroyed by :meth:`DataParallel.close`); a world of one is :class:`SingleProcess`.
    """
    if tdist.is_available() and tdist.is_initialized():
        return SingleProcess() if tdist.get_world_size() == 1 else DataParallel(owner=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SingleProcess()
    cuda = str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))))
    tdist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
    return DataParallel(owner=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no socket holds now: the ``MASTER_PORT`` of a process group whose
    ranks are spawned on this machine without ``torchrun`` (``torch.multiprocessing``, as the tests
    and the step benchmark's data-parallel timing do)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_ranks(problem: Exception, device: str | None = None) -> None:
    """Raise ``problem``, bad input a rank found before training; under ``torchrun`` hand it to the
    other ranks first (they meet in :meth:`DataParallel.agree` and stop too). Without this the
    others would wait for the missing rank in ``init_process_group`` until :data:`TIMEOUT`:
    ``torchrun`` stops the failed rank's own node, not the other nodes."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or (tdist.is_available() and tdist.is_initialized()):
        init_from_env(device or "auto").agree("settings", None, problem)  # a world of one: raises problem
    raise problem


def shard_plan(batches: Sequence, world: int) -> list[list[int]]:
    """Batch positions per rank: longest-processing-time-first on ``num_tokens``, each list in batch order."""
    order = sorted(range(len(batches)), key=lambda b: (-batches[b].num_tokens, b))
    load, plan = [0] * world, [[] for _ in range(world)]
    for b in order:
        r = min(range(world), key=lambda r: (load[r], r))
        plan[r].append(b)
        load[r] += batches[b].num_tokens
    return [sorted(p) for p in plan]


def shard_batches(batches: Sequence, rank: int, world: int) -> list:
    """The micro-batches rank ``rank`` of ``world`` scores (whole batches, balanced by token count)."""
    return [batches[b] for b in shard_plan(batches, world)[rank]]


def gather_scalars(g_local: np.ndarray, loss_local: Sequence[float], batches: Sequence, plan: list[list[int]],
                   rank: int, device="cpu", stop: bool = False) -> tuple[np.ndarray, list[float], bool]:
    """All-gather every rank's scalars into the full ``[K, n_rows]`` array on every rank.

    ``g_local`` is ``[K, n_rows]`` with this rank's rows filled (rows of
    ``batches[b].index`` for ``b`` in ``plan[rank]``); ``loss_local`` holds the
    per-batch train-loss sums of this rank's batches, in plan order; ``stop`` says
    that this rank was asked to stop (SIGTERM, Ctrl-C). Returns the full array, the
    per-batch loss sums in global batch order, and whether any rank was asked to
    stop. Each rank sends ``K * rows + batches + 1`` float64 values.
    """
    k = g_local.shape[0]
    rows = [np.concatenate([batches[b].index for b in p]) if p else np.zeros(0, np.int64) for p in plan]
    sizes = [k * len(r) + len(p) for r, p in zip(rows, plan)]
    width = max(sizes) + 1  # the last value: the stop request
    mine = np.zeros(width, dtype=np.float64)
    mine[:k * len(rows[rank])] = g_local[:, rows[rank]].ravel()
    mine[k * len(rows[rank]):sizes[rank]] = np.asarray(loss_local, dtype=np.float64)
    mine[-1] = float(stop)
    send = torch.from_numpy(mine).to(device)
    recv = [torch.empty_like(send) for _ in plan]
    tdist.all_gather(recv, send)
    g = np.zeros_like(g_local)
    loss = [0.0] * len(batches)
    any_stop = False
    for r, (buf, p) in enumerate(zip(recv, plan)):
        values = buf.cpu().numpy()
        n_r = len(rows[r])
        g[:, rows[r]] = values[:k * n_r].reshape(k, n_r)
        for b, s in zip(p, values[k * n_r:sizes[r]]):
            loss[b] = float(s)
        any_stop = any_stop or bool(values[-1])
    return g, loss, any_stop


class SingleProcess:
    """One process: every method passes through (no communication)."""

    rank, world, is_main = 0, 1, True
    #: set by :meth:`two_point_scalars`: some rank was asked to stop (its ``stop`` argument) this step
    stop_requested = False

    def close(self) -> None:
        pass

    def agree(self, what: str, value, problem: Exception | None = None) -> None:
        """One process: raise ``problem``, if any."""
        if problem is not None:
            raise problem

    def sync_weights(self, params) -> None:
        pass

    def announce(self, step: int, idx) -> None:
        pass

    def publish(self, coefs: Sequence[float], lr: float) -> None:
        pass

    def stop(self) -> None:
        pass

    def two_point_scalars(self, perturber, step: int, num_directions: int, mu: float, batches: Sequence,
                          loss_fn: Callable, n_rows: int, device, stop: bool = False) -> tuple[np.ndarray, float]:
        from paczero.zo import two_point_scalars

        self.stop_requested = stop
        return two_point_scalars(perturber, step, num_directions, mu, batches, loss_fn, n_rows, device)


class DataParallel(SingleProcess):
    """A rank of an initialised process group (see the module docstring for the protocol)."""

    def __init__(self, owner: bool = False):
        self.owner = owner
        self.rank, self.world = tdist.get_rank(), tdist.get_world_size()
        self.is_main = self.rank == 0
        self.comm_device = "cuda" if tdist.get_backend() == "nccl" else "cpu"

    def close(self) -> None:
        """Leave the process group if :func:`init_from_env` created it (and it is still there): a
        process that exits with a gloo group alive aborts now and then ("terminate called without an
        active exception", 9 of 120 exits on this machine under load), which torchrun reports as a
        failed rank."""
        if self.owner and tdist.is_initialized():
            tdist.destroy_process_group()

    def _bcast(self, obj=None):
        box = [obj]
        tdist.broadcast_object_list(box, src=0, device=torch.device(self.comm_device) if self.comm_device == "cuda"
                                    else None)
        return box[0]

    def agree(self, what: str, value, problem: Exception | None = None) -> None:
        """All ranks meet: each brings its ``value`` of ``what`` (a JSON-able value) and the bad input
        it found, if any. Raises :class:`RankStopped` on every rank when a rank brings a problem (the
        lowest such rank's, named) or when the values differ (naming what differs, e.g. the generator
        of z: a rank without Triton on CUDA would follow other directions than the rest)."""
        brought = [None] * self.world
        mine = None if problem is None else (str(problem).splitlines() or [problem.__class__.__name__])[0]
        tdist.all_gather_object(brought, (value, mine))
        found = [(r, text) for r, (_, text) in enumerate(brought) if text is not None]
        values = [v for v, _ in brought]
        if found or any(v != values[0] for v in values):
            # every rank raises the same (the first problem, else the differences: one line per node, see
            # RankStopped), after leaving a group of its own (see close)
            self.close()
            if found:
                r, text = found[0]
                raise RankStopped(text if r == self.rank else f"rank {r} stopped: {text}") from problem
            raise RankStopped(_differences(what, values))

    def sync_weights(self, params) -> None:
        """Every rank starts from rank 0's trainable weights (fresh or resumed), bit for bit."""
        for _, p in params:
            buf = p.data.to(self.comm_device).contiguous()
            tdist.broadcast(buf, src=0)
            if not self.is_main:
                p.data.copy_(buf.to(p.device))

    def announce(self, step: int, idx) -> None:
        """Rank 0: step ``step`` starts; ``idx`` is the mechanism's subsample (None: all of U)."""
        self._bcast((int(step), None if idx is None else np.asarray(idx)))

    def receive(self):
        """Other ranks: ``(step, idx)`` of the next step, or None when rank 0 has stopped."""
        return self._bcast()

    def publish(self, coefs: Sequence[float], lr: float) -> None:
        """Rank 0: the release of this step (public: the coefficients and the learning rate)."""
        self._bcast(([float(c) for c in coefs], float(lr)))

    def receive_release(self) -> tuple[list[float], float]:
        return self._bcast()

    def stop(self) -> None:
        """Rank 0: no more steps (normal end or a stop request); the other ranks leave :func:`run_follower`."""
        self._bcast(None)

    def two_point_scalars(self, perturber, step: int, num_directions: int, mu: float, batches: Sequence,
                          loss_fn: Callable, n_rows: int, device, stop: bool = False) -> tuple[np.ndarray, float]:
        """:func:`paczero.zo.two_point_scalars` over this rank's share, gathered: same result on every rank.

        ``stop``: this rank was asked to stop; the request travels with the scalars, and
        :attr:`stop_requested` tells every rank whether any rank made it (rank 0 then ends the run
        after this step with a checkpoint, as on its own SIGTERM)."""
        from paczero.zo import two_point_scalars

        plan = shard_plan(batches, self.world)
        sums: list[float] = []
        g, _ = two_point_scalars(perturber, step, num_directions, mu, [batches[b] for b in plan[self.rank]],
                                 loss_fn, n_rows, device, batch_losses=sums)
        g, sums, self.stop_requested = gather_scalars(g, sums, batches, plan, self.rank, self.comm_device, stop)
        loss_sum = 0.0
        for s in sums:  # the single process's order of summation: the train loss is bit-identical
            loss_sum += s
        return g, loss_sum / max(sum(len(b.index) for b in batches), 1)


def run_follower(cfg, ranks: DataParallel) -> dict:
    """The loop of a rank other than 0: score its share of each step, apply rank 0's release. Holds no secret."""
    from paczero.run.build import build_together, step_batches
    from paczero.models import trainable_parameters
    from paczero.run.stop import StopRequest
    from paczero.zo import Perturber, zo_step

    setup, _ = build_together(cfg, ranks)
    model, task = setup.model, setup.task
    params = trainable_parameters(model, cfg.track)
    perturber = Perturber(model, params, cfg.seed, lockstep=cfg.lockstep_batches, token_budget=cfg.token_budget)
    full_batches = task.make_batches(setup.universe, token_budget=cfg.token_budget)
    ranks.agree("directions", perturber.directions)
    ranks.sync_weights(params)
    steps = 0
    with StopRequest() as stop:  # SIGTERM / Ctrl-C: ask rank 0 to end the run (at the end of a step, checkpointed)
        while (msg := ranks.receive()) is not None:
            step, idx = msg
            batches, rows = step_batches(task, setup.universe, full_batches, idx, cfg.token_budget)
            zo_step(step, batches, rows, perturber=perturber, ranks=ranks, loss_fn=lambda b: task.losses(model, b),
                    num_directions=cfg.num_directions, mu=cfg.mu, clip=cfg.clip, weight_decay=cfg.weight_decay,
                    device=setup.device, release=lambda clipped: ranks.receive_release(), stop=stop.requested)
            steps += 1
    return {"rank": ranks.rank, "steps": steps}
