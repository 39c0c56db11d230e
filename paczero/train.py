"""The training loop: Algorithm 1 of the paper, one step after another.

Read top to bottom: ``_train`` sets up (config, run folder, model, data, mechanism), resumes
(:mod:`paczero.run.resume`) or begins, evaluates zero-shot, then runs ``_loop``: for each step t

1. ask the mechanism which examples to score (PAC: the whole universe U);
2. compute the per-sample two-point scalars for each of the K public directions;
3. stability-clip them and hand them to the mechanism, which releases K values;
4. update theta <- (1 - lr*wd) theta - (lr/K) sum_k Y_k z_k;
5. log the public transcript record; evaluate on dev; checkpoint.

Finally the dev-best weights (selected on dev metrics only: post-processing,
no privacy cost) are evaluated on the test split and the run summary with its
privacy statement is written.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from paczero.run.build import (Given, Setup, build_together, environment, evaluate, load_trainable, near_chance,
                           small_splits_note, split_sizes, step_batches, trainable_state)
from paczero.tasks.prompts import prompt_line
from paczero.run import duration, resume
from paczero.checkpoint import (MARKER, atomic_json, clear_run_dir, prepare_run_dir, run_record, save_checkpoint,
                                set_times)
from paczero.run.curves import write_run_curves
from paczero.run.step_record import step_record
from paczero.config import AUTO, DP_MECHANISMS, FIRST_ORDER, TrainConfig
from paczero.run.journal import Journal, check_resumed_config, recorded_data
from paczero.run.publish import make_stage, publish, working_dir
from paczero.run.rungs import Ladder, log_line, read_rungs, rungs_privacy
from paczero.run.stop import StopRequest
from paczero.run.trackers import check_report_to, open_tracker
from paczero.run.release import write_release
from paczero.run.selection import base_released_line, better, recorded_dev, save_best, save_selected, selection_metric
from paczero.privacy.statement import privacy_statement_text, secret_source

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


def make_mechanism(cfg: TrainConfig, n_universe: int, private_rng: np.random.Generator,
                   design: np.ndarray | None = None, secret_rng=None):
    """The configured mechanism. The candidate design and the secret index j* come from ``secret_rng``
    (a key of their own, :func:`paczero.privacy.subsets.secret_generator`; default: ``private_rng``), the
    coins, noise and Poisson masks from ``private_rng``.

    ``design`` is given when resuming (the checkpoint's design); otherwise it is drawn. A resumed
    mechanism's j* comes from its saved state.
    """
    from paczero.mechanisms import build_mechanism
    from paczero.privacy.subsets import balanced_design

    name = cfg.mechanism
    if name in DP_MECHANISMS:
        from paczero.mechanisms import DPSGD, DPAggZO, DPZero, DPZeroAggZO1

        if name in ("dpzero", "dp-sgd"):  # normalised by q * n_train: under add-or-remove adjacency N is private
            return (DPSGD if name == "dp-sgd" else DPZero)(
                n_universe, cfg.epsilon, cfg.delta, cfg.steps, cfg.sample_rate, cfg.dp_clip,
                accountant=cfg.accountant, seed=private_rng, public_size=cfg.n_train)
        return (DPAggZO if name == "dp-aggzo" else DPZeroAggZO1)(  # dpzero-aggzo1: DP-AggZO's code at K = 1
            n_universe, cfg.epsilon, cfg.delta, cfg.steps, cfg.sample_rate, cfg.dp_clip, cfg.num_directions,
            accountant=cfg.accountant, seed=private_rng)
    if name in ("mezo", "adamw"):  # mini-batches from the public seed
        return build_mechanism(name, batch_size=cfg.batch_size, seed=cfg.seed)
    secret_rng = private_rng if secret_rng is None else secret_rng
    if design is None:
        design = balanced_design(n_universe, cfg.num_subsets, secret_rng)
    secret = int(secret_rng.integers(cfg.num_subsets))
    common = dict(num_subsets=cfg.num_subsets, design=design, secret=secret, seed=private_rng)
    if name == "pac-zpl":
        return build_mechanism(name, coin_step=cfg.coin_step, **common)
    if name == "pac-mi":
        return build_mechanism(name, total_mi=cfg.mi_budget, total_steps=cfg.steps, schedule=cfg.schedule,
                               coin_step=cfg.coin_step, noised_coef=cfg.noised_coef, **common)
    if name == "hybrid":
        return build_mechanism(name, total_mi=cfg.mi_budget, total_steps=cfg.steps, switch_step=cfg.switch_step,
                               schedule=cfg.schedule, coin_step=cfg.coin_step, noised_coef=cfg.noised_coef, **common)
    return build_mechanism(name, **common)


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
    cfg = cfg.replace(**{k: _resolved(getattr(cfg, k)) for k in ("data", "dev_data", "test_data")  # recorded
                         if getattr(cfg, k) not in (None, "demo")})  # absolute: eval, audit and resume run elsewhere
    cfg = fit_to_machine(cfg)  # dtype auto and an unset mu resolved (and recorded); torch's threads
    if cfg.resume and cfg.template == AUTO:
        cfg = resume.recorded_choice(cfg)  # the prompt the run chose on dev, not a new choice
    ranks = init_from_env(cfg.device)  # torchrun: data parallel over U; a single process: pass-through
    lock = None
    try:
        run_dir, lock = _claim_run_dir(cfg, ranks, given)
        if not ranks.is_main:  # the other ranks score their share of U and apply rank 0's release; no secret
            from paczero.run.distributed import run_follower
            return run_follower(cfg, ranks)
        with ThreadShare(cfg.threads or omp_threads()):  # threads shared with paczero runs on the same cores
            return _train(cfg, ranks, run_dir, log, given)
    finally:
        if lock is not None:
            lock.release()
        ranks.close()  # leave the process group this call joined: a process exiting in it may abort


def _resolved(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def _claim_run_dir(cfg: TrainConfig, ranks, given: Given | None = None):
    """Rank 0's output folder, checked and locked (``(None, None)`` on the other ranks). The cheap checks
    come first; under torchrun every rank learns of any rank's bad input (``ranks.agree``)."""
    from paczero.run.distributed import shared_settings
    from paczero.models import check_model_source

    problem, run_dir, lock = None, None, None
    try:
        if given is None or given.model is None:  # a model given in memory names no source
            check_model_source(cfg.model)
        if ranks.is_main:
            local_model = Path(cfg.model).expanduser()
            run_dir, lock = prepare_run_dir(cfg.out_dir, overwrite=cfg.overwrite, resume=cfg.resume,
                                            reads={"data file": cfg.data if cfg.data != "demo" else None,
                                                   "model": str(local_model) if local_model.exists() else None})
            if cfg.resume:
                saved = json.loads(run_record(run_dir).read_text())["config"]
                if saved.get("data") not in (None, "demo"):  # recorded as given before paths were resolved
                    saved["data"] = _resolved(saved["data"])
                check_resumed_config(saved, cfg)
    except ValueError as e:
        problem = e
    try:
        ranks.agree("settings", shared_settings(cfg), problem)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return run_dir, lock


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
        _begin(run)  # run.json
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
        size = "a private number of examples" if _private_batches(cfg) else \
            f"{self.n} examples, {len(self.full_batches)} micro-batches"  # add-or-remove adjacency: N is private
        took = "" if _private_batches(cfg) else f"; setup {time.time() - self.t_setup:.1f}s"  # DP: no clock at all
        self.log(f"paczero: {cfg.mechanism} on {cfg.task} ({size}, {cfg.track}, {cfg.model}){took}")

    def evaluate_zero_shot(self) -> None:
        """The base model on dev, test (and the out-of-domain test), unless a checkpoint holds it."""
        setup = self.setup
        if self.weights_step != 0 or not self.cfg.eval_zero_shot or self.zero_shot is not None:
            return
        self.zero_shot = {"dev": evaluate(setup, setup.dev_enc), "test": evaluate(setup, setup.test_enc)}
        if setup.ood_enc is not None:
            self.zero_shot["ood_test"] = evaluate(setup, setup.ood_enc)
        self.log(f"zero-shot: dev {_fmt(self.zero_shot['dev'])} | test {_fmt(self.zero_shot['test'])}"
                 + (f" | ood test {_fmt(self.zero_shot['ood_test'])}" if setup.ood_enc is not None else ""))
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
                  "seconds": None if _private_batches(self.cfg) else self.cum_time}
        save_checkpoint(self.run_dir, step, trainable_state(self.params), public,
                        {"mechanism": self.mechanism.state_dict()})


def _set_up(cfg: TrainConfig, ranks, run_dir: Path, log, given: Given | None):
    """The run's model, data, directions and mechanism (on a resume: on the original run's design), and
    the resume point (None for a new run)."""
    from paczero.models import compile_body, trainable_parameters
    from paczero.privacy.subsets import private_generator, secret_generator
    from paczero.zo import Perturber

    t_setup = time.time()
    recorded = recorded_data(run_dir) if cfg.resume else None
    setup, fingerprint = build_together(cfg, ranks, recorded, given)
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

        run.first_order = attach(cfg, ranks, setup, params)
    return run, resumed


def _begin(run: Run) -> None:
    """A new run's run.json (after ``--overwrite`` cleared the folder: every input is read and checked by now)."""
    cfg = run.cfg
    kept = clear_run_dir(run.out_dir) if cfg.overwrite else []
    if kept:
        _log.warning(f"--overwrite replaced the run in {str(run.out_dir)!r} and kept what paczero did not write "
                     f"there: {', '.join(kept)}")
    if run.run_dir != run.out_dir:  # a DP run: its private stage (made after --overwrite cleared the folder)
        make_stage(run.out_dir)
    public_data = {} if _private_batches(cfg) else {"universe_size": run.n, "data_fingerprint": run.fingerprint}
    atomic_json(run.run_dir / "run.json", {"marker": MARKER, "config": cfg.to_dict(), **public_data,
                                           "secret_source": secret_source(cfg, _claims_privacy(run.mechanism)),
                                           "directions": run.perturber.directions, **_in_memory(run.setup),
                                           **_prompt(run.setup)})


def _loop(run: Run) -> tuple[int, bool]:
    """Steps ``run.start`` .. T-1 of Algorithm 1; returns (steps done, whether a stop request ended it early)."""
    from paczero.machine.thread_share import refresh as refresh_threads

    cfg, setup, mechanism, ranks = run.cfg, run.setup, run.mechanism, run.ranks
    task = setup.task

    def loss_fn(batch):
        return task.losses(setup.model, batch)

    bar, eta = _progress(cfg, run.start), duration.Estimate(cfg.steps, run.start, _private_batches(cfg), run.log)
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
                                              lr=lr_at(cfg, step), device=setup.device)
                releases = [result.release]
            else:  # the zeroth-order step of Algorithm 1 (paczero/zo/)
                result, releases = _zeroth_order_step(run, step, batches, rows, loss_fn, stop.requested)
            stop.requested = stop.requested or ranks.stop_requested  # another rank's SIGTERM ends the run too
            seconds = time.time() - t0
            run.cum_time += eta.add(seconds)  # the expected duration said after the first steps (not DP)
            train_loss = result.train_loss
            if _private_batches(cfg):
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
                run.log(f"\nstopped at step {done}: checkpoint written; " + (f"a {cfg.mechanism} run cannot be resumed (its "
                        "optimizer state is not saved)" if run.first_order else "continue with --resume"))
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
    summary = None if stopped else finish(run.setup, run.run_dir, run.params, run.mechanism, run.best,
                                          run.zero_shot, run.cum_time, run.log)
    run.tracker.close(summary)
    write_run_curves(run.run_dir)  # RUN/curves.png, from the public files (paczero/run/curves.py)
    if not stopped and run.run_dir != run.out_dir:  # a DP run's outputs, published at once (paczero/run/publish.py)
        publish(run.run_dir, run.out_dir)
    elif not stopped and _private_batches(run.cfg):  # a DP run an earlier paczero began in place: one time for all
        set_times(run.run_dir, time.time())
    if stopped:  # the guarantee so far: the weights of a stopped run are post-processing of its releases
        return {"stopped_at": done, "out_dir": str(run.out_dir), "privacy": run.mechanism.privacy_statement()}
    return summary


def finish(setup: Setup, run_dir: Path, params, mechanism, best, zero_shot, seconds: float, log=print) -> dict:
    """Evaluate the dev-best (or final) weights on test, save the model, write summary.json."""
    cfg = setup.cfg
    final_dev = recorded_dev(run_dir / "evals.jsonl", cfg.steps)  # the loop evaluated the final weights
    if final_dev is None:
        final_dev = evaluate(setup, setup.dev_enc)
    selected_step = cfg.steps
    if cfg.dev_best and best is not None and (run_dir / "best" / "weights.safetensors").exists() \
            and best["step"] != cfg.steps:
        from safetensors.torch import load_file

        load_trainable(params, load_file(str(run_dir / "best" / "weights.safetensors")))
        selected_step = best["step"]
    save_selected(run_dir / "selected.safetensors", params)
    test = evaluate(setup, setup.test_enc)
    dev = best["dev"] if (cfg.dev_best and best is not None) else final_dev
    statement = mechanism.privacy_statement()
    statement["secret_source"] = secret_source(cfg, statement.get("private") is not False)
    statement["dev_best_selection"] = ("post-processing: selection reads only dev metrics and costs no privacy"
                                       if cfg.dev_best else "off (final weights)")
    if selected_step == 0:
        statement["released"] = "the weights before training (step 0): public, no release of the run enters them"
    if (setup.prompt or {}).get("source") == "auto":
        statement["prompt_selection"] = (f"template auto: the prompt chosen among {len(setup.prompt['candidates'])} "
                                         "candidates by their zero-shot dev loss (dev only; no cost to the guarantee)")
    if cfg.rungs:
        statement["rungs"] = rungs_privacy(cfg)
    summary = {
        "config": cfg.to_dict(),
        **_in_memory(setup),
        "metric": setup.task.metric,
        "select_metric": selection_metric(cfg, setup.task) if cfg.dev_best else None,  # what chose selected_step
        **_prompt(setup),
        "zero_shot": zero_shot,
        "final_dev": final_dev,
        "selected_step": selected_step,
        "dev": dev,
        "test": test,
        "privacy": statement,
        "privacy_text": privacy_statement_text(statement, cfg),
        "sizes": split_sizes(setup),  # the universe, dev and test sets' rows (the config's n_train, n_dev, n_test)
        "train_seconds": None if _private_batches(cfg) else seconds,  # DP: time grows with the private batches
        "seconds_per_step": None if _private_batches(cfg) else seconds / cfg.steps,
        "environment": environment(setup.device),
    }
    if setup.ood_enc is not None:  # config ood_data: the out-of-domain test file, whole
        summary["ood_test"] = evaluate(setup, setup.ood_enc)
        log(f"fine-tuned ood test {_fmt(summary['ood_test'])} ({cfg.ood_data})")
    if cfg.heldout_attack:  # the loss attack on the released weights: U's records vs the held-out test records
        from paczero.audit.heldout import run_heldout_attack

        summary["heldout_attack"] = run_heldout_attack(setup, run_dir, log, private=_private_batches(cfg))
    if cfg.rungs:  # the ladder: the weights of this one trajectory at each rung (paczero/run/rungs.py)
        summary["rungs"] = read_rungs(run_dir)
    write_release(setup, run_dir / "model", summary)  # weights, tokenizer, task.json, model card
    atomic_json(run_dir / "summary.json", summary)
    if zero_shot:
        log(f"zero-shot  test {_fmt(zero_shot['test'])}")
    log(f"fine-tuned test {_fmt(test)} (weights of step {selected_step}, dev {_fmt(dev)})")
    if selected_step == 0:
        log(base_released_line(cfg.track))
    log(summary["privacy_text"])
    return summary


def _prompt(setup: Setup) -> dict:
    """run.json's and summary.json's ``prompt`` (classification): the template and answer words the run scores,
    where they came from, and template auto's candidates with their zero-shot dev metrics."""
    return {"prompt": setup.prompt} if setup.prompt is not None else {}


def _in_memory(setup: Setup) -> dict:
    """run.json's and summary.json's note of what was given as objects in memory (the config's ``model``
    then names the model object's ``name_or_path``)."""
    return {**({"in_memory": list(setup.in_memory)} if setup.in_memory else {}),
            **({"data_use": setup.data_use} if setup.data_use else {})}


def _private_batches(cfg: TrainConfig) -> bool:
    """The DP baselines score a Poisson sample of the universe: its size is private, and so are the train loss
    over it and every time that grows with it (per step, in total, a progress bar's rate)."""
    return cfg.mechanism in DP_MECHANISMS


def _claims_privacy(mechanism) -> bool:
    return mechanism.privacy_statement().get("private") is not False


def _fmt(metrics: dict) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def _progress(cfg: TrainConfig, start: int):
    from tqdm.auto import tqdm

    # into a file (a sweep's cell log, a batch job's output) a line a minute, not ten a second
    pace = {"mininterval": 0.1 if sys.stderr.isatty() else 60.0}
    if _private_batches(cfg):  # no rate, no elapsed time; into a file a line every tenth of the run, never on a clock
        pace = {"bar_format": "{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}"}
        if not sys.stderr.isatty():
            pace.update(mininterval=0.0, maxinterval=float("inf"), miniters=max(1, cfg.steps // 10))
    return tqdm(total=cfg.steps, initial=start, disable=not cfg.progress, unit="step", dynamic_ncols=True,
                file=sys.stderr, **pace)
