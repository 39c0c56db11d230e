"""The privacy statement of a run, as text a model card can carry.

The numbers come from the mechanism's ``privacy_statement()``; this module
only words them, honestly: PAC Privacy bounds the informed adversary's
membership-inference success over the candidate-set distribution
D = Unif{S_1..S_M}; it is not a differential-privacy guarantee, and the
matched DP epsilon is a numerical reference point only (paper, Section 2).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from paczero.config import DP_MECHANISMS, PAC_PRIVATE


def secret_source(cfg, private: bool = True) -> str:
    """Where the secret randomness came from (a fixed private seed voids the guarantee); ``private``:
    whether the mechanism makes a privacy claim (a non-private reference has no secret)."""
    if not private:
        return "none (a non-private reference)"
    if cfg.private_seed is None:
        return "os-entropy"
    return "fixed-seed (reproduction/testing only: the secret is not secret)"


def _num(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def privacy_statement_text(statement: dict[str, Any], cfg) -> str:
    """The statement in words: the guarantee (``mi_bound``, ``mia_bound``) first; for the PAC mechanisms
    the realised spend (``mi_spent``) follows, labelled as one run's value, not a bound."""
    mech = statement.get("mechanism", cfg.mechanism)
    lines: list[str] = []
    if statement.get("private") is False:
        lines.append(f"Privacy: none. '{mech}' is a non-private reference; it makes no privacy claim.")
    elif mech in DP_MECHANISMS:
        lines.append(
            f"Privacy: ({statement.get('epsilon_rdp', float('nan')):.4g}, {statement.get('delta')})-DP by the RDP "
            f"accountant ({statement.get('epsilon_pld', float('nan')):.4g} by PLD) for {statement.get('steps')} steps "
            f"with Poisson sampling rate {statement.get('sample_rate')} (target epsilon {statement.get('epsilon_target')}). "
            f"Membership-inference success is at most {statement.get('mia_bound', float('nan')):.4f}.")
    else:
        bound = statement.get("mi_bound")
        lines.append(
            f"Privacy (PAC Privacy, {mech}): guaranteed I(S*; transcript) <= {_num(bound, '.6g')} nats "
            + ("(no noised release: the transcript carries no information about the secret; Theorem 2)" if bound == 0.0
               else "(the MI budget; Theorem 1)")
            + f" over {statement.get('steps')} steps; so the informed adversary's membership-inference success is "
            f"at most {_num(statement.get('mia_bound'), '.4f')} (prior 0.5).")
        if bound:
            lines.append(f"For reference only, (epsilon={_num(statement.get('matched_dp_epsilon'), '.4g')}, "
                         f"delta=1e-5)-DP gives the same MIA bound; this is not a DP guarantee.")
        if statement.get("mi_spent") is not None:
            lines.append(
                f"Realised MI spend of this run: {statement['mi_spent']:.6g} nats, the sum of its per-release MI "
                "charges. It is a realised value of one run, not a bound: the guarantee above bounds its "
                "expectation over runs.")
        lines.append(
            f"The guarantee is over the candidate-set distribution Unif{{S_1..S_{statement.get('num_subsets')}}} of "
            f"subsets of the {cfg.n_train}-example universe (each example in half of them); unanimity rate "
            f"{statement.get('unanimity_rate', 0.0):.1%} of {statement.get('steps')} steps.")
        lines.append(
            "What it protects: which of the candidate subsets (so which examples of the universe) trained the model. "
            "It assumes the adversary knows the universe itself (which records are in it and what they say), the "
            "candidate subsets, the base model and the mechanism; those are not protected.")
    src = statement.get("secret_source", secret_source(cfg, statement.get("private") is not False))
    if statement.get("private") is not False and src != "os-entropy":
        lines.append(f"WARNING: secret randomness from a {src}.")
    lines.append(f"Dev-best selection reads only dev metrics: post-processing, no cost to the guarantee above; the "
                 f"{cfg.n_dev} dev examples that choose the released step are not covered by it."
                 if cfg.dev_best else "Final weights released (no selection).")
    return "\n".join(lines)


def guarantee_summary(statement: dict[str, Any]) -> str:
    """One line: the guarantee of a statement (never a realised spend)."""
    if statement.get("private") is False:
        return "none (a non-private reference)."
    if statement.get("epsilon_target") is not None:
        return (f"({statement['epsilon_target']:.4g}, {statement.get('delta')})-DP; membership-inference success "
                f"at most {_num(statement.get('mia_bound'), '.4f')} (prior 0.5).")
    return (f"membership-inference success at most {_num(statement.get('mia_bound'), '.4f')} (prior 0.5), from "
            f"I(S*; transcript) <= {_num(statement.get('mi_bound'), '.6g')} nats (PAC Privacy).")


def model_card(summary: dict[str, Any]) -> str:
    """A model card (README.md, Hugging Face format) for a run's released model: what was trained, how,
    its metrics and the privacy statement in words."""
    from importlib.metadata import PackageNotFoundError, version

    cfg = summary["config"]
    try:
        made_by = f"paczero {version('paczero')}"
    except PackageNotFoundError:  # pragma: no cover - a source checkout that is not installed
        made_by = "paczero"
    metric = summary.get("metric", "accuracy")
    base = cfg["model"]
    parts = base.split("/")
    hub_id = len(parts) == 2 and all(parts) and not base.startswith((".", "~")) and not Path(base).expanduser().exists()
    if not hub_id and "/" in base:
        base = "a local model"  # its path may say more than a public card should
    track = "LoRA adapters (peft)" if cfg["track"] == "lora" else "full fine-tuning (every weight)"

    def score(split: dict | None) -> str:
        return "n/a" if not split or split.get(metric) is None else f"{split[metric]:.4f}"

    rows = [f"| fine-tuned (weights of step {summary.get('selected_step')}) | {score(summary.get('dev'))} | "
            f"{score(summary.get('test'))} |"]
    if summary.get("zero_shot"):
        rows.insert(0, f"| zero-shot {base} | {score(summary['zero_shot'].get('dev'))} | "
                       f"{score(summary['zero_shot'].get('test'))} |")
    data = {"sst2": "SST-2 (stanfordnlp/sst2)", "squad": "SQuAD v1.1 (rajpurkar/squad)",
            "demo": "the paczero demo sentiment set"}.get(cfg["task"], cfg["task"])
    if cfg.get("data") not in (None, "demo"):
        data = "a local data file"  # its path may say more than a public card should
    front = ["---", f"base_model: {base}" if hub_id else None, "library_name: " + ("peft" if cfg["track"] == "lora"
                                                                                         else "transformers"),
             "tags:", "- paczero", "- pac-privacy" if cfg["mechanism"] in PAC_PRIVATE else None,
             "- zeroth-order", "---"]
    return "\n".join([line for line in front if line is not None] + [
        "",
        f"# {base}, fine-tuned with {cfg['mechanism']} ({made_by})",
        "",
        f"- Base model: `{base}`; trained: {track}, dtype {cfg['dtype']}.",
        f"- Task: {cfg['task']} on {data}: a training universe of {cfg['n_train']} examples, {cfg['n_dev']} dev "
        f"examples (selection), test as reported below.",
        f"- Training: zeroth-order, {cfg['steps']} steps, {cfg['num_subsets']} candidate subsets, lr {cfg['lr']:g}, "
        f"mu {cfg['mu']:g}, public seed {cfg['seed']}.",
        f"- Privacy guarantee: {guarantee_summary(summary.get('privacy') or {})}",
        "",
        f"| | dev {metric} | test {metric} |",
        "|---|---|---|",
        *rows,
        "",
        "## Privacy",
        "",
        summary["privacy_text"],
        "",
        "The numbers behind this statement are in `summary.json` (`privacy`) of the run that produced this model.",
        "",
    ])
