"""The benchmark's set-up and timed loop body: :class:`BenchConfig` and :class:`Harness`."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class BenchConfig:
    model: str = "tiny-opt"
    task: str = "demo"
    track: str = "lora"
    n: int = 256
    dtype: str = "fp32"
    device: str = "cpu"
    token_budget: int = 4096
    lockstep: int = 1               # full FT: token budgets per sign in a lock-step wave of + and - forwards (0: off)
    num_subsets: int = 128
    mechanism: str = "pac-zpl"
    mi_budget: float = 1.0          # pac-mi only: total MI over `steps`
    steps: int = 3                  # timed steps (after one warm-up step)
    num_directions: int = 1
    mu: float = 1e-3
    lr: float = 1e-6
    scaling: bool = True
    memory: bool = True
    plain: bool = True              # also time a plain transformers forward of the same rows (a fresh process)
    memory_repeats: int = 1         # fresh processes per memory phase (phases alternate; medians reported)
    live_memory: bool = False       # CPU: also the peak of live tensor bytes per phase (own processes, profiled)
    world: int = 1                  # > 1: also time a data-parallel step with this many processes
    threads: int | None = None      # torch intra-op threads (None: as paczero train, paczero.machine.hardware.set_threads)
    seed: int = 0
    random_init: bool = False       # the model's architecture (config only) with random weights
    compile: bool = False           # torch.compile the model body (LoRA; both the floor and the step run it)
    account: bool = False           # also account for one floor pass's time by module category (hooks)
    data: str | None = None         # the task's data file (a classification file of your own)
    columns: dict | None = None     # the file's column names for the task's fields (as paczero train's --columns)
    labels: list | None = None      # the class names (as paczero train's --labels)
    verbalizer: dict | None = None  # label -> answer word (as paczero train's --verbalizer)
    template: str | None = None     # the prompt template (as paczero train's --template)
    two_classes: bool = False       # time the step against the same rows' two-class step (paczero.bench.classes)
    host: bool = False              # also time each method's step split into model time and host time


class Harness:
    """A loaded model, its task, the universe's micro-batches and the step's parts, for timing."""

    def __init__(self, cfg: BenchConfig, lm=None):
        import torch

        from paczero.machine.hardware import set_threads
        from paczero.models import load_model
        from paczero.run.build import fills_batches
        from paczero.tasks import build_task

        set_threads(cfg.threads)  # as paczero train sets them
        self.cfg = cfg
        self.lm = lm or load_model(cfg.model, dtype=cfg.dtype, device=cfg.device, track=cfg.track,
                                   init_seed=cfg.seed, random_init=cfg.random_init)
        self.model = self.lm.model
        if cfg.compile:
            from paczero.models import compile_body

            compile_body(self.model)
        self.task = build_task(cfg.task, self.lm.tokenizer, fill_batches=fills_batches(cfg.device, cfg.dtype),  # as train's
                               template=cfg.template, verbalizer=cfg.verbalizer, labels=cfg.labels)
        self.perturber = None
        self.data: dict[int, tuple[list, list]] = {}
        self.universe, self.batches = self.data_for(cfg.n)
        #: the floor's micro-batches: the task's batching as train builds it on this device (padding capped at
        #: 10 % on a CPU in fp32, filled to the token budget on a GPU and in native bf16), which the step scores
        #: too (built once, shared)
        self.floor_batches = self.batches

    def data_for(self, n: int) -> tuple[list, list]:
        """The universe of size ``n`` (the task's examples cycled) and its micro-batches."""
        from paczero.tasks import load_splits

        if n not in self.data:
            pool, _, _ = load_splits(self.cfg.task, self.cfg.data, n_train=None, n_dev=0, n_test=0, seed=self.cfg.seed,
                                     columns=self.cfg.columns, labels=self.cfg.labels)
            universe = self.task.encode([pool[i % len(pool)] for i in range(n)])
            self.data[n] = universe, self.task.make_batches(universe, token_budget=self.cfg.token_budget)
        return self.data[n]

    def get_perturber(self):
        """The model's Perturber (built once)."""
        from paczero.models import trainable_parameters
        from paczero.zo import Perturber

        if self.perturber is None:
            self.perturber = Perturber(self.model, trainable_parameters(self.model, self.cfg.track), self.cfg.seed,
                                       lockstep=self.cfg.lockstep, token_budget=self.cfg.token_budget)
        return self.perturber

    def sync(self) -> None:
        import torch

        if str(self.cfg.device).startswith("cuda"):
            torch.cuda.synchronize()

    def floor_pass(self) -> float:
        """One inference pass over the universe: the per-sample losses at theta."""
        import torch

        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            for batch in self.floor_batches:
                self.task.losses(self.model, batch.to(self.cfg.device)).cpu()
        self.sync()
        self.last_cpu_s = time.process_time() - c0
        return time.perf_counter() - t0

    def mechanism(self, num_subsets: int, n: int):
        from paczero.config import MI_BUDGETED, TrainConfig
        from paczero.privacy.subsets import private_generator
        from paczero.train import make_mechanism

        c = self.cfg
        tc = TrainConfig(model=c.model, mechanism=c.mechanism, num_subsets=num_subsets, steps=c.steps + 1,
                         mi_budget=c.mi_budget if c.mechanism in MI_BUDGETED else None,
                         switch_step=c.steps + 1 if c.mechanism == "hybrid" else None, private_seed=c.seed)
        return make_mechanism(tc.validate(), n, private_generator(c.seed))

    def runner(self, num_subsets: int, ranks=None, n: int | None = None) -> Callable[[int], dict]:
        """The training loop's step (:func:`paczero.zo.zo_step`) as a function of the step number, with a
        fresh mechanism; returns part timings."""
        from paczero.run.build import step_batches
        from paczero.run.distributed import SingleProcess
        from paczero.zo import zo_step

        ranks = ranks or SingleProcess()
        c = self.cfg
        self.get_perturber()
        n = n or self.cfg.n
        universe, full_batches = self.data_for(n)
        mech = self.mechanism(num_subsets, n) if ranks.is_main else None

        def release(clipped):
            if not ranks.is_main:
                return ranks.receive_release()
            coefs = [r.coef for r in mech.step(clipped)]
            ranks.publish(coefs, c.lr)
            return coefs, c.lr

        def one_step(step: int) -> dict:
            t0, c0 = time.perf_counter(), time.process_time()
            if ranks.is_main:
                idx = mech.batch_indices(n)
                ranks.announce(step, idx)
            else:
                _, idx = ranks.receive()
            batches, rows = step_batches(self.task, universe, full_batches, idx, c.token_budget)
            parts = zo_step(step, batches, rows, perturber=self.perturber, ranks=ranks,
                            loss_fn=lambda b: self.task.losses(self.model, b), num_directions=c.num_directions,
                            mu=c.mu, clip=None, weight_decay=0.0, device=c.device, release=release).seconds
            self.sync()
            step_s = time.perf_counter() - t0
            return {"step_s": step_s, "scalars_s": parts["scalars_s"], "privacy_s": parts["release_s"],
                    "update_s": step_s - parts["scalars_s"] - parts["release_s"],
                    "step_cpu_s": time.process_time() - c0}

        return one_step

    def steps(self, num_subsets: int, count: int, ranks=None) -> list[dict]:
        """``count`` + 1 loop bodies (the first is a warm-up, dropped); per-step part timings."""
        one_step = self.runner(num_subsets, ranks)
        return [one_step(step) for step in range(count + 1)][1:]


#: the benchmark's DP-SGD step settings (its cost does not depend on them)
DPSGD_EPSILON, DPSGD_DELTA, DPSGD_CLIP, DPSGD_LR = 2.0, 1e-5, 1.0, 1e-4


def dpsgd_runner(h: Harness) -> Callable[[int], dict]:
    """One DP-SGD step over the whole universe (sample rate 1) as a function of the step number."""
    from paczero.run.build import step_batches
    from paczero.fo.dpsgd_step import dpsgd_step, grad_sample_mode, wrap
    from paczero.mechanisms.dpsgd import DPSGD
    from paczero.models import trainable_parameters

    c = h.cfg
    params = trainable_parameters(h.model, c.track)
    fo = wrap(h.model, params, lr=DPSGD_LR, weight_decay=0.0, clip=DPSGD_CLIP,
              mode=grad_sample_mode(h.model, params, c.track))
    mech = DPSGD(c.n, DPSGD_EPSILON, DPSGD_DELTA, c.steps + 2, 1.0, DPSGD_CLIP, seed=c.seed)

    def one_step(step: int) -> dict:
        t0, c0 = time.perf_counter(), time.process_time()
        idx = mech.batch_indices(c.n)
        batches, _ = step_batches(h.task, h.universe, h.batches, idx, c.token_budget)
        dpsgd_step(batches, fo=fo, mechanism=mech, loss_fn=lambda b: h.task.losses(h.model, b), lr=DPSGD_LR,
                   device=c.device)
        h.sync()
        return {"step_s": time.perf_counter() - t0, "step_cpu_s": time.process_time() - c0}

    return one_step


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)
