"""`paczero privacy` (the bounds' conversions) and `paczero audit` (audits of a finished run)."""
from __future__ import annotations

import json

from paczero.config import ConfigError


def _add_privacy(sub) -> None:
    """`paczero privacy`: an MI budget's MIA bound and matched epsilon, or the reverse."""
    p = sub.add_parser("privacy", help="MIA bound and matched DP epsilon of an MI budget (or the reverse)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--mi", type=float, help="total MI budget in nats")
    g.add_argument("--epsilon", type=float, help="a DP epsilon: the MI with the same MIA bound")
    g.add_argument("--mia", type=float, help="a target MIA success bound: the MI that guarantees it")
    p.add_argument("--delta", type=float, default=1e-5, help="the DP delta of --epsilon and of the matched epsilon "
                   "(default: 1e-05)")
    p.add_argument("--json", action="store_true", help="print the numbers as one JSON object")


def _cmd_privacy(ns) -> int:
    from paczero.privacy import dp_epsilon_matching_mi, mi_for_mia, mi_matching_dp, mia_bound

    if ns.epsilon is not None:
        mi = mi_matching_dp(ns.epsilon, delta=ns.delta)
    elif ns.mia is not None:
        mi = mi_for_mia(ns.mia)
    else:
        mi = ns.mi
    bound = mia_bound(mi)
    eps = dp_epsilon_matching_mi(mi, delta=ns.delta) if mi > 0 else 0.0
    out = {"mi_nats": mi, "mia_bound": bound, "matched_dp_epsilon": eps, "delta": ns.delta, "prior": 0.5}
    if ns.json:
        print(json.dumps(out))
    else:
        print(f"MI budget        {mi:.6g} nats  (the guarantee I(S*; transcript) <= budget, Theorem 1)")
        print(f"MIA success <=   {bound:.4f}  (prior 0.5; PAC Privacy, eq. pac_mi_bound)")
        print(f"matched DP eps   {eps:.4g}  (delta={ns.delta:g}; same MIA bound, a reference point only, not DP)")
        if bound > 0.99995:
            print("note: a bound of 1 says nothing: at this MI (or epsilon) the informed adversary may succeed always")
    return 0


def _add_audit(sub) -> None:
    """`paczero audit`: membership-inference audits of finished runs."""
    p = sub.add_parser("audit", help="membership-inference audit of finished runs (several: pooled); prints only "
                       "public values unless --reveal-secret")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished run folders (fresh secrets each)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the AUC interval")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--reveal-secret", action="store_true",
                   help="also score the attacks against the truth (accuracy, AUC, whether j* was found, verdicts): "
                        "computed with the secret j* and the true membership, so the output is PRIVATE and must "
                        "not be published")
    p.add_argument("--last-bits", action="store_true",
                   help="only the last-bits attack (Mironov): how many of each run's published noised values only one "
                        "sign of s_j* can produce exactly (0 with paczero's exact grid noise; also part of the "
                        "default audit)")
    p.add_argument("--heldout", action="store_true",
                   help="instead: the attack the field measures, on runs of any mechanism: the released model's loss "
                        "on the records of U against the held-out test records of the same file (AUC per run, with "
                        "what bounds it: DP's epsilon does, the PAC guarantee does not)")
    g = p.add_argument_group("the one-run canary audit (Steinke et al. 2023; docs/audit.md)", "of a DP run trained "
                             "with --canaries M (its default audit): reads the run, trains nothing, and prints a lower "
                             "bound on its epsilon at 95 % confidence (also in RUN_DIR/canary_audit.json)")
    g.add_argument("--guess-in", type=int, metavar="K", help="guess 'in' for the K highest scores (default: M/4)")
    g.add_argument("--guess-out", type=int, metavar="K", help="guess 'out' for the K lowest (default: M/4)")


def _cmd_audit(ns) -> int:
    from paczero.audit.membership import audit, format_report

    if ns.bootstrap < 1:
        raise ValueError(f"--bootstrap must be >= 1, got {ns.bootstrap}")
    from paczero.audit.canaries import canary_command, planted_runs

    if (ns.guess_in, ns.guess_out) != (None, None) or not (ns.heldout or ns.last_bits) and planted_runs(ns.run_dirs):
        return canary_command(ns)  # runs trained with --canaries M: their one-run audit (no training)
    if ns.heldout:
        from paczero.audit.heldout import format_heldout, heldout_audit

        if ns.reveal_secret or ns.last_bits:
            raise ConfigError("--heldout is an audit of its own (not with --reveal-secret or --last-bits): "
                              "run them one at a time")
        found = heldout_audit(ns.run_dirs, bootstrap=ns.bootstrap)
        print(json.dumps(found, indent=1) if ns.json else format_heldout(found))
        return 0
    from paczero.audit.lsb_attack import audit_transcript, format_transcript_audit

    if ns.last_bits and ns.reveal_secret:
        raise ConfigError("--last-bits reads only published values: it has no secret to reveal")
    last_bits = {str(run): audit_transcript(run) for run in ns.run_dirs}
    lines = [f"{run}: {format_transcript_audit(found)}" for run, found in last_bits.items()]
    if ns.last_bits:
        print(json.dumps(last_bits, indent=1) if ns.json else "\n".join(lines))
        return 0
    report = audit(ns.run_dirs, bootstrap=ns.bootstrap, reveal_secret=ns.reveal_secret)
    if ns.json:
        print(json.dumps({**report, "last_bits": last_bits}, indent=1))
    else:
        print(format_report(report) + "\n\n" + "\n".join(lines))
    return 0


#: each command's parser and handler
COMMANDS = {
    "privacy": (_add_privacy, _cmd_privacy),
    "audit": (_add_audit, _cmd_audit),
}
