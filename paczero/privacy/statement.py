"""The privacy statement of a run, as text a model card can carry.

The numbers come from the mechanism's ``privacy_statement()``; this module
only words them, honestly: PAC Privacy bounds the informed adversary's
membership-inference success over the candidate-set distribution
D = Unif{S_1..S_M}; it is not a differential-privacy guarantee, and the
matched DP epsilon is a numerical reference point only (paper, Section 2).
"""
from __future__ import annotations

import math
from typing import Any

from paczero.config import DP_MECHANISMS


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
    opening = plain_guarantee(statement, cfg.n_train)
    if opening:  # one or two sentences a non-expert reads correctly; the details below
        lines.append(opening)
    if statement.get("private") is False:
        lines.append(f"Privacy: none. '{mech}' is a non-private reference; it makes no privacy claim.")
    elif mech in DP_MECHANISMS:
        lines.append(
            f"Privacy: ({statement.get('epsilon_rdp', float('nan')):.4g}, {statement.get('delta')})-DP by the RDP "
            f"accountant ({statement.get('epsilon_pld', float('nan')):.4g} by PLD) for {statement.get('steps')} steps "
            f"with Poisson sampling rate {statement.get('sample_rate')} (target epsilon {statement.get('epsilon_target')}). "
            f"Membership-inference success is at most {statement.get('mia_bound', float('nan')):.4f}.")
        if statement.get("delta_discretization") is not None:
            lines.append(f"Noise: {statement.get('noise')}, exact; drawing it so adds "
                         f"{statement['delta_discretization']:.1e} to delta (docs/privacy.md).")
        elif mech == "dp-sgd":
            lines.append("Noise: a float Gaussian per gradient coordinate from the private SHAKE-256 stream; the "
                         "(epsilon, delta) above are the Gaussian mechanism's, which float noise approximates, and "
                         "no bound here covers the difference (docs/privacy.md, 'Noise on a finite computer').")
    else:
        bound = statement.get("mi_bound")
        lines.append(plain_words(statement.get("num_subsets"), cfg.n_train))
        lines.append(
            f"Privacy (PAC Privacy, {mech}): guaranteed I(S*; transcript) <= {_num(bound, '.6g')} nats "
            + ("(no noised release: the transcript carries no information about the secret; Theorem 2)" if bound == 0.0
               else "(the MI budget; Theorem 1)")
            + f" over {statement.get('steps')} steps; so the informed adversary's membership-inference success, for "
            f"the membership of a record of U in S*, given U (U: the training universe; S*: the candidate subset that "
            f"trained the model), is at most {_num(statement.get('mia_bound'), '.4f')} (prior 0.5).")
        if bound:
            lines.append(f"For reference only, (epsilon={_num(statement.get('matched_dp_epsilon'), '.4g')}, "
                         f"delta=1e-5)-DP gives the same MIA bound; this is not a DP guarantee.")
            lines.append("Noised releases: y~ = s_j* + exact discrete Gaussian noise on a public power-of-two grid "
                         "that both signs lie on, charged the MI of that lattice channel; no last bit of y~ tells the "
                         "sign (`paczero audit RUN --last-bits`).")
        if statement.get("coin_step") == "skip":
            lines.append("Coin steps did not move the weights (coin_step skip): where the subsets disagreed and no "
                         "noised release was paid for, the step released nothing and the weights stayed; whether a "
                         "step is such a step is public, so this changes no bound above"
                         + (", and the released model is a function of public inputs alone, with no assumption "
                            "about the private generator." if not bound else "."))
            lines.append("So the model is a function of all of U: each step that moves it moves it along a sign that "
                         "every candidate subset shares (or a noised release), computed from every record of U; S* "
                         "only decides signs the subsets dispute, and those are released as a coin or with noise. "
                         "Nothing above bounds an attack that tells U's records from records outside U (the "
                         "train-vs-held-out loss attack, `heldout_attack`): U itself is not protected.")
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
            "The adversary of the guarantee knows the universe itself (which records are in it and what they say), "
            "the candidate subsets, the base model and the mechanism; those are not protected.")
    src = statement.get("secret_source", secret_source(cfg, statement.get("private") is not False))
    if statement.get("private") is not False and src != "os-entropy":
        lines.append(f"WARNING: secret randomness from a {src}.")
    chosen = " and the prompt (template auto)" if statement.get("prompt_selection") else ""
    dev_rows = "" if mech in DP_MECHANISMS else f"{cfg.n_dev} "  # a DP run's dev: the rows its stable split drew
    lines.append(f"Dev-best selection reads only dev metrics: post-processing, no cost to the guarantee above; the "
                 f"{dev_rows}dev examples that choose the released step{chosen} are not covered by it."
                 if cfg.dev_best else "Final weights released (no selection).")
    if statement.get("prompt_selection") and not cfg.dev_best:
        lines.append(f"The prompt was chosen on the {cfg.n_dev} dev examples (template auto); they are not covered "
                     "by the guarantee above.")
    if statement.get("released"):
        lines.append("Released: the weights before training (step 0; no trained step beat them on dev), public "
                     "inputs alone.")
    if getattr(cfg, "rungs", None) and statement.get("private") is not False:
        lines.append(f"Rungs {', '.join(map(str, cfg.rungs))}: the weights saved at step t are computed from the "
                     "public directions and the first t releases (post-processing); each carries the guarantee above, "
                     "no smaller one.")
    return "\n".join(lines)


def plain_guarantee(statement: dict[str, Any], n_train: int) -> str | None:
    """The first line of a run's statement and model card: what the guarantee means, in one or two sentences a
    reader who is no privacy expert reads correctly (PAC: what is hidden, and that the records and their use
    are not; DP: the epsilon and what it bounds). None for a non-private reference."""
    if statement.get("private") is False:
        return None
    mia = statement.get("mia_bound")
    odds = "" if mia is None else f" at best {100 * mia:.1f} % of the time (50 % is a coin toss)"
    if statement.get("epsilon_target") is not None or statement.get("mechanism") in DP_MECHANISMS:
        eps = statement.get("epsilon_rdp", statement.get("epsilon_target"))
        return (f"In plain words: this run is ({_num(eps, '.3g')}, {statement.get('delta')})-differentially private: "
                f"adding or removing any one record of the training data changes the chance of anything it "
                f"releases by at most a factor e^epsilon = {_num(None if eps is None else math.exp(eps), '.3g')} "
                f"(plus delta), so an attacker tells whether a given record was used{odds}. This covers every "
                "training record (a row of U): what the model reveals about it, and whether it was used. The dev and "
                "test rows are not covered: they are read without protection (dev chooses the released step, test's "
                "metrics are published); where they must stay private, give public dev and test files (--dev-data, "
                "--test-data).")
    return (f"In plain words: this run hides which of the {n_train} training records were in the secret half "
            f"(S*) that trained the model: an attacker who holds all {n_train} tells a record's half{odds}. "
            "It does not hide the records themselves, nor that they were used.")


def plain_words(num_subsets: int | None, n_train: int) -> str:
    """The PAC statement's details for a reader who is no privacy expert: what is public, what is hidden."""
    return (f"What is protected, in plain words: the {n_train} records of the training universe U (the training "
            "data) are treated as public: an attacker may hold every one of them and know that U was used. Hidden "
            f"is which of them make up the secret subset S* (one of {num_subsets} candidate subsets, each half of U) "
            "that the mechanism trains on: the guarantee below bounds how well such an attacker can tell, for a "
            "record of U, whether it was in S* (membership inference among U's records). Not protected: U's records "
            "themselves, and that U was used (every step scores all of U; where the subsets disagree it releases a "
            "coin or a noised sign, so that S* stays hidden).")


def guarantee_summary(statement: dict[str, Any]) -> str:
    """One line: the guarantee of a statement (never a realised spend)."""
    if statement.get("private") is False:
        return "none (a non-private reference)."
    if statement.get("epsilon_target") is not None:
        return (f"({statement['epsilon_target']:.4g}, {statement.get('delta')})-DP; membership-inference success "
                f"at most {_num(statement.get('mia_bound'), '.4f')} (prior 0.5).")
    return (f"membership-inference success at most {_num(statement.get('mia_bound'), '.4f')} (prior 0.5) for the "
            f"membership of a record of U in S*, given U (U: the training universe; S*: the candidate subset that "
            f"trained it), from I(S*; transcript) <= {_num(statement.get('mi_bound'), '.6g')} nats (PAC Privacy).")
