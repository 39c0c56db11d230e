"""A run's end: the dev-best (or final) weights selected, evaluated on test, released with the model card, and
``summary.json`` with the privacy statement written (:func:`finish`)."""
from __future__ import annotations

from pathlib import Path

from paczero.checkpoint import atomic_json
from paczero.privacy.statement import privacy_statement_text, secret_source
from paczero.run.build import Setup, environment, evaluate, evaluate_per_class, load_trainable, split_sizes
from paczero.run.prelude import fmt, in_memory_record, private_batches, prompt_record
from paczero.run.release import write_release
from paczero.run.rungs import read_rungs, rungs_privacy
from paczero.run.selection import base_released_line, recorded_dev, save_selected, selection_metric


def finish(setup: Setup, run_dir: Path, params, mechanism, best, zero_shot, seconds: float, log=print,
           attack=None) -> dict:
    """Evaluate the dev-best (or final) weights on test, save the model, write summary.json. ``attack``: the
    held-out loss attack to run on the released weights (:func:`paczero.audit.heldout.run_heldout_attack`,
    handed in by the loop where the config asks for it)."""
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
    test, test_recall = evaluate_per_class(setup, setup.test_enc)
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
        **in_memory_record(setup),
        "metric": setup.task.metric,
        "select_metric": selection_metric(cfg, setup.task) if cfg.dev_best else None,  # what chose selected_step
        **prompt_record(setup),
        "zero_shot": zero_shot,
        "final_dev": final_dev,
        "selected_step": selected_step,
        "dev": dev,
        "test": test,
        **({"test_recall": test_recall} if test_recall is not None else {}),  # each class's recall on test
        "privacy": statement,
        "privacy_text": privacy_statement_text(statement, cfg),
        "sizes": split_sizes(setup),  # the universe, dev and test sets' rows (the config's n_train, n_dev, n_test)
        "train_seconds": None if private_batches(cfg) else seconds,  # DP: time grows with the private batches
        "seconds_per_step": None if private_batches(cfg) else seconds / cfg.steps,
        "environment": environment(setup.device),
    }
    if setup.ood_enc is not None:  # config ood_data: the out-of-domain test file, whole
        summary["ood_test"] = evaluate(setup, setup.ood_enc)
        log(f"fine-tuned ood test {fmt(summary['ood_test'])} ({cfg.ood_data})")
    if attack is not None:  # the loss attack on the released weights (config heldout_attack), given by the loop
        summary["heldout_attack"] = attack(setup, run_dir, log, private=private_batches(cfg))
    if cfg.rungs:  # the ladder: the weights of this one trajectory at each rung (paczero/run/rungs.py)
        summary["rungs"] = read_rungs(run_dir)
    write_release(setup, run_dir / "model", summary)  # weights, tokenizer, task.json, model card
    atomic_json(run_dir / "summary.json", summary)
    if zero_shot:
        log(f"zero-shot  test {fmt(zero_shot['test'])}")
    log(f"fine-tuned test {fmt(test)} (weights of step {selected_step}, dev {fmt(dev)})")
    if selected_step == 0:
        log(base_released_line(cfg.track))
    log(summary["privacy_text"])
    return summary
