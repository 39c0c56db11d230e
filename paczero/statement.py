"""The privacy statement of a run, as text a model card can carry.

The numbers come from the mechanism's ``privacy_statement()``; this module
only words them, honestly: PAC Privacy bounds the informed adversary's
membership-inference success over the candidate-set distribution
D = Unif{S_1..S_M}; it is not a differential-privacy guarantee, and the
matched DP epsilon is a numerical reference point only (paper, Section 2).
"""
from __future__ import annotations

from typing import Any


def secret_source(cfg) -> str:
    """Where the secret randomness came from (a fixed private seed voids the guarantee)."""
    if cfg.private_seed is None:
        return "os-entropy"
    return "fixed-seed (reproduction/testing only: the secret is not secret)"


def privacy_statement_text(statement: dict[str, Any], cfg) -> str:
    mech = statement.get("mechanism", cfg.mechanism)
    lines: list[str] = []
    if statement.get("private") is False:
        lines.append(f"Privacy: none. '{mech}' is a non-private reference; it makes no privacy claim.")
    elif mech in ("dpzero", "dp-aggzo"):
        lines.append(
            f"Privacy: ({statement.get('epsilon_rdp', float('nan')):.4g}, {statement.get('delta')})-DP by the RDP "
            f"accountant ({statement.get('epsilon_pld', float('nan')):.4g} by PLD) for {statement.get('steps')} steps "
            f"with Poisson sampling rate {statement.get('sample_rate')} (target epsilon {statement.get('epsilon_target')}). "
            f"Membership-inference success is at most {statement.get('mia_bound', float('nan')):.4f}.")
    else:
        mi = statement.get("mi_spent", 0.0)
        budget = statement.get("mi_total_budget")
        lines.append(
            f"Privacy (PAC Privacy, {mech}): I(S*; transcript) <= {mi:.6g} nats"
            + (f" (budget {budget:.6g})" if budget else "")
            + f" over {statement.get('steps')} steps; the informed adversary's membership-inference success is at most "
            f"{statement.get('mia_bound', 0.5):.4f} (prior 0.5).")
        if mi > 0:
            lines.append(f"For reference only, (epsilon={statement.get('matched_dp_epsilon', float('nan')):.4g}, "
                         f"delta=1e-5)-DP gives the same MIA bound; this is not a DP guarantee.")
        lines.append(
            f"The guarantee is over the candidate-set distribution Unif{{S_1..S_{statement.get('num_subsets')}}} of "
            f"subsets of the {cfg.n_train}-example universe (each example in half of them); unanimity rate "
            f"{statement.get('unanimity_rate', 0.0):.1%} of {statement.get('steps')} steps.")
    src = statement.get("secret_source", secret_source(cfg))
    if src != "os-entropy":
        lines.append(f"WARNING: secret randomness from a {src}.")
    lines.append("Dev-best selection reads only dev metrics: post-processing, no privacy cost."
                 if cfg.dev_best else "Final weights released (no selection).")
    return "\n".join(lines)
