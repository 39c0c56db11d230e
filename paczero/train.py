"""The training loop: Algorithm 1 of the paper, one step after another.

Read top to bottom: ``_train`` sets up (config, run folder, model, data, mechanism: the prelude's parts in
:mod:`paczero.run.prelude`), resumes (:mod:`paczero.run.resume`) or begins, evaluates zero-shot, then runs
``_loop``: for each step t

1. ask the mechanism which examples to score (PAC: the whole universe U);
2. compute the per-sample two-point scalars for each of the K public directions;
3. stability-clip them and hand them to the mechanism, which releases K values;
4. update theta <- (1 - lr*wd) theta - (lr/K) sum_k Y_k z_k;
5. log the public transcript record; evaluate on dev; checkpoint.

Finally the dev-best weights (selected on dev metrics only: post-processing,
no privacy cost) are evaluated on the test split and the run summary with its
privacy statement is written (:mod:`paczero.run.finish`).
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from paczero.checkpoint import save_checkpoint, set_times
from paczero.config import AUTO, FIRST_ORDER, TrainConfig
from paczero.run import duration, resume
from paczero.run.build import (Given, Setup, build_together, evaluate, evaluate_per_class, near_chance, small_splits_note,
                               step_batches, trainable_state)
from paczero.run.curves import write_run_curves
from paczero.run.finish import finish
from paczero.run.journal import Journal, recorded_data
from paczero.run.prelude import begin, claim_run_dir, fmt, make_mechanism, private_batches, resolved
from paczero.run.progress import progress_bar as _progress
from paczero.run.publish import publish, working_dir
from paczero.run.rungs import Ladder, log_line
from paczero.run.selection import better, save_best, selection_metric
from paczero.run.step_record import step_record
from paczero.run.stop import StopRequest
from paczero.run.trackers import check_report_to, open_tracker
from paczero.tasks.prompts import prompt_line

_log = logging.getLogger(__name__)  # warnings: on stderr (the CLI prints them as "paczero: warning: ...")


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The learning rate of step ``step`` (0-based) under the configured schedule."""
    frac = step / cfg.steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "linear":
        return cfg.lr * (1.0 - frac)
    lr_end = 1e-7  # polynomial (power 1) decay to 1e-7 over T, the reference's default
    return (cfg.lr - lr_end) * (1.0 - frac) + lr_end if cfg.lr > lr_end else cfg.lr


def train(config: TrainConfig, *, log=print, given: Given | None = None) -> dict[str, Any]:
    """Run (or resume) one fine-tuning run; return the run summary (also written to summary.json).
    ``given``: a model, tokenizer or examples given in memory in place of the config's (paczero.api)."""
    from paczero.run.distributed import init_from_env, stop_ranks
    from paczero.machine.hardware import fit_to_machine, omp_threads
    from paczero.machine.thread_share import ThreadShare

    try:
        cfg = config.validate()
        check_report_to(cfg)  # the tracker's library is installed (paczero/run/trackers.py)
    except ValueError as e:  # under torchrun the other ranks stop with this one (as in `paczero train`)
        stop_ranks(e, config.device)
    cfg = cfg.replace(**{k: resolved(getattr(cfg, k)) for k in ("data", "dev_data", "test_data")  # recorded
                         if getattr(cfg, k) not in (None, "demo")})  # absolute: eval, audit and resume run elsewhere
    cfg = fit_to_machine(cfg)  # dtype auto and an unset mu resolved (and recorded); torch's threads
    if cfg.resume and cfg.template == AUTO:
        cfg = resume.recorded_choice(cfg)  # the prompt the run chose on dev, not a new choice
    ranks = init_from_env(cfg.device)  # torchrun: data parallel over U; a single process: pass-through
    lock = None
    try:
        run_dir, lock = claim_run_dir(cfg, ranks, given)
        if not ranks.is_main:  # the other ranks score their share of U and apply rank 0's release; no secret
            from paczero.run.distributed import run_follower
            return run_follower(cfg, ranks)
        with ThreadShare(cfg.threads or omp_threads()):  # threads shared with paczero runs on the same cores
            return _train(cfg, ranks, run_dir, log, given)
    finally:
        if lock is not None:
            lock.release()
        ranks.close()  # leave the process group this call joined: a process exiting in it may abort


def _train(cfg: TrainConfig, ranks, out_dir: Path, log, given: Given | None = None) -> dict[str, Any]:
    """Set up, resume or begin, evaluate zero-shot, run the loop, finish: each a named call. A DP run writes
    in its private stage and publishes into ``out_dir`` at the end (paczero/run/publish.py)."""
    run_dir = working_dir(cfg, out_dir)
    run, resumed = _set_up(cfg, ranks, run_dir, log, given)  # model, data, directions, mechanism
    cfg = run.cfg  # template auto: with the prompt chosen on dev
    run.out_dir = out_dir
    if resumed is not None:
        resume.restore(run, resumed)  # weights, mechanism state, log and evals at the resume point
    else:
        begin(run, secrets=_keep_planted)  # run.json (and first which canaries trained, if any)
    run.open_journal(resumed)
    run.evaluate_zero_shot()
    run.ladder = Ladder(cfg, run.setup, run_dir, run.params, upto=run.start)  # T-ladder rungs, if any
    run.tracker = open_tracker(cfg, run_dir, run.mechanism)  # report_to: the public values (paczero/run/trackers.py)
    if resumed is not None:
        resume.replay(run, resumed)  # the logged steps after the checkpoint, from their published updates
    ranks.agree("directions", run.perturber.directions)
    ranks.sync_weights(run.params)
    done, stopped = _loop(run)
    return _end(run, done, stopped)


class Run:
    """One run's live state, as the loop reads and updates it: the built model and data, the trainable
    parameters and their directions, the mechanism, and the bookkeeping (dev-best, zero-shot, time)."""

    def __init__(self, cfg: TrainConfig, ranks, run_dir: Path, log, setup: Setup, fingerprint, params, perturber,
                 mechanism, t_setup: float):
        self.cfg, self.ranks, self.run_dir, self.log, self.setup = cfg, ranks, run_dir, log, setup
        self.out_dir = run_dir  # where the run is published: run_dir, or (a DP run) the folder above its stage
        self.t_setup = t_setup  # when set-up began
        self.fingerprint, self.params, self.perturber, self.mechanism = fingerprint, params, perturber, mechanism
        self.n = len(setup.universe)
        self.full_batches = setup.task.make_batches(setup.universe, token_budget=cfg.token_budget)
        self.start = self.weights_step = 0  # the next step to run; the step of the weights loaded
        self.best: dict | None = None  # dev-best: {"step", "dev"}
        self.zero_shot: dict | None = None
        self.cum_time = 0.0
        self.journal = self.ladder = self.tracker = None
        self.first_order = None  # a first-order engine: DP-SGD's Opacus hooks, or adamw's optimizer (paczero/fo/)

    def open_journal(self, resumed) -> None:
        """The private journal, begun with the mechanism's state unless it holds this run's start; one line."""
        self.journal = Journal(self.run_dir)
        if resumed is None or not resumed.point.journaled:  # before any release of this process
            self.journal.start(self.start, self.mechanism.state_dict(), data_fingerprint=self.fingerprint)
        cfg = self.cfg
        size = "a private number of examples" if private_batches(cfg) else \
            f"{self.n} examples, {len(self.full_batches)} micro-batches"  # add-or-remove adjacency: N is private
        took = "" if private_batches(cfg) else f"; setup {time.time() - self.t_setup:.1f}s"  # DP: no clock at all
        self.log(f"paczero: {cfg.mechanism} on {cfg.task} ({size}, {cfg.track}, {cfg.model}){took}")

    def evaluate_zero_shot(self) -> None:
        """The base model on dev, test (and the out-of-domain test), unless a checkpoint holds it."""
        setup = self.setup
        if self.weights_step != 0 or not self.cfg.eval_zero_shot or self.zero_shot is not None:
            return
        test, test_recall = evaluate_per_class(setup, setup.test_enc)
        self.zero_shot = {"dev": evaluate(setup, setup.dev_enc), "test": test,
                          **({"test_recall": test_recall} if test_recall is not None else {})}
        if setup.ood_enc is not None:
            self.zero_shot["ood_test"] = evaluate(setup, setup.ood_enc)
        self.log(f"zero-shot: dev {fmt(self.zero_shot['dev'])} | test {fmt(self.zero_shot['test'])}"
                 + (f" | ood test {fmt(self.zero_shot['ood_test'])}" if setup.ood_enc is not None else ""))
        if near_chance(setup, self.zero_shot["dev"]):
            self.log(near_chance(setup, self.zero_shot["dev"]))
        metric = selection_metric(self.cfg, setup.task)
        if self.cfg.dev_best and (self.best is None or better(self.zero_shot["dev"], self.best["dev"], metric)):
            self.best = {"step": 0, "dev": self.zero_shot["dev"]}  # the weights before training are a candidate
            save_best(self.run_dir, self.params)

    def evaluate_due(self, done: int, recorded: set | frozenset = frozenset()) -> dict | None:
        """Evaluate on dev after ``done`` steps where due (unless ``recorded`` holds that step's evaluation
        already), keeping the dev-best weights; returns the dev metrics, if evaluated."""
        cfg = self.cfg
        if not (done % cfg.eval_every == 0 or done == cfg.steps or self.ladder.due(done)) or done in recorded:
            return None
        dev = evaluate(self.setup, self.setup.dev_enc)
        improved = self.best is None or better(dev, self.best["dev"], selection_metric(cfg, self.setup.task))
        if improved and cfg.dev_best:
            self.best = {"step": done, "dev": dev}
            save_best(self.run_dir, self.params)
        with open(self.run_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps({"step": done, "dev": dev, "best_step": self.best["step"] if self.best else None})
                    + "\n")
        self.tracker.evaluation(done, dev)
        return dev

    def checkpoint(self, step: int) -> None:
        public = {"step": step, "best": self.best, "zero_shot": self.zero_shot,
                  "seconds": None if private_batches(self.cfg) else self.cum_time}
        kept = self.first_order.optimizer_state() if self.first_order else None  # AdamW's (paczero/fo/state.py)
        save_checkpoint(self.run_dir, step, trainable_state(self.params), public,
                        {"mechanism": self.mechanism.state_dict()}, tensors=kept)


def _set_up(cfg: TrainConfig, ranks, run_dir: Path, log, given: Given | None):
    """The run's model, data, directions and mechanism (on a resume: on the original run's design), and
    the resume point (None for a new run)."""
    from paczero.models import compile_body, trainable_parameters
    from paczero.privacy.subsets import private_generator, secret_generator
    from paczero.zo import Perturber

    t_setup = time.time()
    recorded = recorded_data(run_dir) if cfg.resume else None
    setup, fingerprint = build_together(cfg, ranks, recorded, given)
    if cfg.canaries:  # the one-run audit's canaries, each trained on with probability 1/2 (paczero/audit/canaries.py)
        from paczero.audit.canaries import plant
        plant(setup, run_dir, resume=cfg.resume)
    if recorded is not None and recorded.get("prompt"):  # how the run's prompt was chosen (template auto)
        setup.prompt = recorded["prompt"]
    if small_splits_note(setup):  # dev or test under 50 rows: said once
        log(small_splits_note(setup))
    if setup.prompt is not None:  # classification: the prompt and the answer words it scores, said once
        log(prompt_line(setup.prompt))
    cfg = setup.cfg  # template auto: the chosen prompt
    params = trainable_parameters(setup.model, cfg.track)
    perturber = Perturber(setup.model, params, cfg.seed, lockstep=cfg.lockstep_batches,
                          token_budget=cfg.token_budget)
    if cfg.compile:
        compile_body(setup.model)  # compiled on the first forward (the zero-shot evaluation, or the first step)
    resumed = resume.read(run_dir, ranks, perturber) if cfg.resume else None
    mechanism = make_mechanism(cfg, len(setup.universe), private_generator(cfg.private_seed),
                               design=resumed.design if resumed else None,
                               secret_rng=secret_generator(cfg.private_seed))
    run = Run(cfg, ranks, run_dir, log, setup, fingerprint, params, perturber, mechanism, t_setup)
    if cfg.mechanism in FIRST_ORDER:  # DP-SGD (Opacus's hooks) or adamw on the trainable parameters (paczero/fo/)
        from paczero.fo import attach

        run.first_order = attach(cfg, ranks, setup, params, run_dir)
    return run, resumed


def _loop(run: Run) -> tuple[int, bool]:
    """Steps ``run.start`` .. T-1 of Algorithm 1; returns (steps done, whether a stop request ended it early)."""
    from paczero.machine.thread_share import refresh as refresh_threads

    cfg, setup, mechanism, ranks = run.cfg, run.setup, run.mechanism, run.ranks
    task = setup.task

    def loss_fn(batch):
        return task.losses(setup.model, batch)

    bar, eta = _progress(cfg, run.start), duration.Estimate(cfg.steps, run.start, private_batches(cfg), run.log)
    done, stopped = run.start, False
    with StopRequest() as stop, open(run.run_dir / "log.jsonl", "a") as log_file, run.tracker:
        for step in range(run.start, cfg.steps):
            t0 = time.time()
            refresh_threads()
            idx = mechanism.batch_indices(run.n)  # PAC: None, the whole universe; DP: a private Poisson sample
            ranks.announce(step, idx)
            batches, rows = step_batches(task, setup.universe, run.full_batches, idx, cfg.token_budget)
            if run.first_order is not None:  # a gradient step: DP-SGD or adamw (paczero/fo/)
                result = run.first_order.step(batches, mechanism=mechanism, loss_fn=loss_fn,
                                              lr=lr_at(cfg, step), device=setup.device, step=step)
                releases = [result.release]
            else:  # the zeroth-order step of Algorithm 1 (paczero/zo/)
                result, releases = _zeroth_order_step(run, step, batches, rows, loss_fn, stop.requested)
            stop.requested = stop.requested or ranks.stop_requested  # another rank's SIGTERM ends the run too
            seconds = time.time() - t0
            run.cum_time += eta.add(seconds)  # the expected duration said after the first steps (not DP)
            train_loss = result.train_loss
            if private_batches(cfg):
                # a Poisson-sampled batch is private: its size, its loss and the step's time (which grows with
                # its size) are not in the DP analysis
                train_loss, rows, seconds = None, None, None
            record = step_record(step, releases, mechanism, result.lr, train_loss, seconds, rows)
            run.journal.step(record, mechanism.state_dict())  # on disk before the record can be seen: final
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            run.tracker.step(record)  # the record log.jsonl holds, nothing else

            done = step + 1
            dev = run.evaluate_due(done)
            if dev is not None:
                bar.set_postfix_str(f"dev {task.metric} {dev.get(task.metric, float('nan')):.3f}", refresh=False)
            if (rung := run.ladder.record(done, dev, run.best, record["cum_mi"])) is not None:  # before its checkpoint
                run.log(log_line(rung, task.metric))
            if done % cfg.checkpoint_every == 0 or done == cfg.steps or stop.requested:
                run.checkpoint(done)
            bar.update(1)
            if record["unanimity"] is not None:  # PAC mechanisms; MeZO and DP have no unanimity nor MI
                bar.set_description(f"MI spent {mechanism.mi_spent or 0:.3g} unanimity {record['unanimity']:.0%}",
                                    refresh=False)
            if stop.requested and done < cfg.steps:
                stopped = True
                run.log(f"\nstopped at step {done}: checkpoint written; continue with --resume")
                break
    ranks.stop()
    bar.close()
    run.journal.close()
    return done, stopped


def _zeroth_order_step(run: Run, step: int, batches, rows: int, loss_fn, stop: bool):
    """One zo_step (scalars, the mechanism's release published to the other ranks, update); its result, releases."""
    from paczero.zo import zo_step

    cfg, releases = run.cfg, []

    def release(clipped):
        releases.extend(run.mechanism.step(clipped))
        coefs, lr = [r.coef for r in releases], lr_at(cfg, step)
        run.ranks.publish(coefs, lr)
        return coefs, lr

    result = zo_step(step, batches, rows, perturber=run.perturber, ranks=run.ranks, loss_fn=loss_fn,
                     num_directions=cfg.num_directions, mu=cfg.mu, clip=cfg.clip, weight_decay=cfg.weight_decay,
                     device=run.setup.device, release=release, stop=stop)
    return result, releases


def _end(run: Run, done: int, stopped: bool) -> dict[str, Any]:
    """The test evaluation and release (unless stopped early), the tracker's close and the run's curves."""
    attack = None
    if run.cfg.heldout_attack:  # the loss attack on the released weights: U's records vs the held-out test records
        from paczero.audit.heldout import run_heldout_attack as attack
    summary = None if stopped else finish(run.setup, run.run_dir, run.params, run.mechanism, run.best,
                                          run.zero_shot, run.cum_time, run.log, attack=attack)
    run.tracker.close(summary)
    write_run_curves(run.run_dir)  # RUN/curves.png, from the public files (paczero/run/curves.py)
    if not stopped and run.run_dir != run.out_dir:  # a DP run's outputs, published at once (paczero/run/publish.py)
        publish(run.run_dir, run.out_dir)
    elif not stopped and private_batches(run.cfg):  # a DP run an earlier paczero began in place: one time for all
        set_times(run.run_dir, time.time())
    if stopped:  # the guarantee so far: the weights of a stopped run are post-processing of its releases
        return {"stopped_at": done, "out_dir": str(run.out_dir), "privacy": run.mechanism.privacy_statement()}
    return summary


def _keep_planted(run) -> None:
    """Which canaries trained (``--canaries``): a secret of the run's private/, kept before its run.json."""
    if run.setup.planted is not None:
        from paczero.audit.canaries import keep_planted
        keep_planted(run.run_dir, run.setup.planted)
