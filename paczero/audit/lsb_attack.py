"""The last-bits attack on published noisy values (Mironov, CCS 2012), as an auditor runs it.

For a published value and two hypotheses about the private input (PAC-MI: ``s_{j*} = +1`` or
``-1``; DP: the target record in the sampled batch or not), the attack asks of each hypothesis
whether the sampler that made the value can produce it *exactly*. A hypothesis that cannot is
excluded with certainty; a release with exactly one hypothesis left is *decided*.

* :func:`float_consistent` -- the float samplers (``SecureGenerator.standard_normal``: ``z = sign *
  -ndtri(u)``, ``u = (floor(w / 2) + 0.5) 2^-64`` from a 64-bit word ``w``), pushed through a
  monotone float pipeline ``z -> published``: the pipeline is evaluated at the sampler's 129
  values of ``u`` nearest the inverse of the published value; an exact hit keeps the hypothesis;
  no hit, with the window's ends well on both sides of the value, excludes it (scipy's ``ndtri``
  is monotone only to within a few ulps, so the ends must clear the value by a quarter window);
  anything else leaves it standing (not excluded).
* :func:`grid_consistent` -- lattice mechanisms: a value ``y`` is reachable from input ``s`` iff
  ``(y - s) / grid`` is an integer (exact rational arithmetic): the noise is a discrete Gaussian,
  whose support is every integer.
* :func:`grid_sum_consistent` -- the DP mechanisms' published coefficient ``coef = f(n)`` of an
  integer noisy sum ``n``: the hypothesis stands iff some integer ``n`` maps to ``coef`` exactly
  (every ``n - sum`` is in the discrete Gaussian's support).

:func:`audit_transcript` runs the attack on a run's published noised values (``log.jsonl``; PAC-MI's
``y_tilde``, the DP mechanisms' ``coef``); ``paczero audit RUN`` prints its result. It reads only what is
published. For a DP coefficient the auditor has no records; what it checks is the property on which the
attack fails: the coefficient is the public image of an integer noisy sum, which the sum with and the sum
without any record reach alike (:func:`dp_coefficient_on_grid`). A coefficient off that image was made by a
float sampler, and an adversary who knows the other records can test both hypotheses on its last bits
(tests/test_float_attack.py decides at least 40 % of such releases).
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np
from scipy.special import ndtr, ndtri

__all__ = ["float_consistent", "grid_consistent", "grid_sum_consistent", "decided", "pac_release_consistency",
           "dp_coefficient_on_grid", "audit_transcript", "format_transcript_audit"]

_TWO64 = 2.0 ** 64
_EXACT_BELOW = 2.0 ** 53  # below this, floor(w / 2) + 0.5 is exact: the sampler's u grid is (k + 0.5) 2^-64


def _u_window(u: float, reach: int) -> np.ndarray:
    """The sampler's ``2 reach + 1`` values of ``u`` nearest ``u``, sorted: ``(k + 0.5) 2^-64`` where
    that is exact, else consecutive doubles (``fl(k) + 0.5 = fl(k)`` there, and every double in
    ``[2^-11, 1/2)`` is some ``fl(k) 2^-64``)."""
    scaled = u * _TWO64
    if scaled < _EXACT_BELOW:
        k = max(math.floor(scaled - 0.5), reach)
        return (np.arange(k - reach, k + reach + 1, dtype=np.float64) + 0.5) / _TWO64
    out = [u]
    lo = hi = u
    for _ in range(reach):
        lo, hi = math.nextafter(lo, 0.0), math.nextafter(hi, 1.0)
        out = [lo] + out + [hi]
    return np.array(out)


#: samples examined on each side of the inverse; the outer quarter on each side must lie wholly
#: beyond the value (about 16 ulps of z: scipy's ndtri is monotone to within a few ulps)
_REACH = 64


def float_consistent(published: float, z_estimate: float, pipeline: Callable[[np.ndarray], np.ndarray]) -> bool:
    """Whether a float normal sample ``z`` exists with ``pipeline(z) == published`` exactly.

    ``pipeline`` maps an array of ``z`` to published values, non-decreasing up to ndtri's last-ulp
    wobble; ``z_estimate`` is its approximate inverse at ``published``. Every sample in a window of
    ``2 * 64 + 1`` around the inverse is evaluated: a hit keeps the hypothesis; no hit, with the
    window's outer quarters wholly below and wholly above the value, excludes it; anything else
    leaves it standing.
    """
    sign = 1.0 if z_estimate >= 0.0 else -1.0
    u0 = min(max(float(ndtr(-abs(z_estimate))), 2.0 ** -1074), math.nextafter(0.5, 0.0))
    us = _u_window(u0, _REACH)
    us = us[(us > 0.0) & (us < 0.5)]
    z = sign * -ndtri(us)
    values = pipeline(z[np.argsort(z)])
    if np.any(values == published):
        return True
    quarter = max(len(values) // 4, 1)
    excluded = np.all(values[:quarter] < published) and np.all(values[-quarter:] > published)
    return not excluded


def grid_consistent(value: float, s: int, grid: float) -> bool:
    """Whether ``value = s + grid * x`` for an integer ``x`` (exact rational arithmetic)."""
    ratio = (Fraction(value) - s) / Fraction(grid)
    return ratio.denominator == 1


def grid_sum_consistent(coef: float, estimate: float, mapping: Callable[[int], float], reach: int = 8) -> bool:
    """Whether an integer ``n`` near ``estimate`` gives ``mapping(n) == coef`` exactly."""
    centre = round(estimate)
    return any(mapping(n) == coef for n in range(centre - reach, centre + reach + 1))


def decided(consistent_plus: bool, consistent_minus: bool) -> bool:
    """A release is decided when exactly one hypothesis survives."""
    return consistent_plus != consistent_minus


def _pac_values(record: dict) -> list[tuple[float, float, float]]:
    """``(y~, sigma, grid)`` of each noised release of one log record."""
    ys, sigmas, grids = record.get("y_tilde"), record.get("sigma"), record.get("grid", 0.0)
    if not isinstance(ys, list):
        ys, sigmas, grids = [ys], [sigmas], [grids]
    if not isinstance(grids, list):
        grids = [grids] * len(ys)
    return [(y, s, g or 0.0) for y, s, g in zip(ys, sigmas, grids) if y is not None]


def pac_release_consistency(y: float, sigma: float, grid: float) -> tuple[bool, bool]:
    """Which of ``s = +1`` and ``s = -1`` could have produced the published ``y~`` exactly.

    A release with a grid is checked as a lattice value; one without (a run made with the float
    sampler) through the float sampler's ``y~ = s + sigma * z``.
    """
    if grid:
        return grid_consistent(y, 1, grid), grid_consistent(y, -1, grid)
    out = []
    for s in (1, -1):
        out.append(float_consistent(y, (y - s) / sigma, lambda z, s=s: float(s) + sigma * z))
    return out[0], out[1]


def dp_coefficient_on_grid(coef: float, sigma: float, noise_multiplier: float, clip: float, sample_rate: float,
                           k: int = 1) -> bool:
    """Whether a DP release's published ``coef`` is ``k (2^-40 n C) / d`` for an integer ``n``, where the divisor
    ``d = q m`` (q the sample rate, m an integer size: the data set's, a public one, or DP-AggZO's noisy count)
    reproduces the published ``sigma = (k z C) / d`` exactly (z the noise multiplier): the float arithmetic of
    paczero's DP mechanisms (paczero/mechanisms/dp.py), evaluated at the candidates."""
    scale = (k * noise_multiplier) * clip
    size = round(scale / (sigma * sample_rate))
    dens = [sample_rate * float(m) for m in range(max(1, size - 2), size + 3)]
    for den in (d for d in dens if scale / d == sigma):
        centre = round(coef * den / (k * clip) * 2.0 ** 40)
        if any(k * (math.ldexp(float(n), -40) * clip) / den == coef for n in range(centre - 8, centre + 9)):
            return True
    return False


def _each(record: dict, *fields: str) -> list[tuple]:
    """A record's per-release values (lists where a step made several releases) as one tuple per release."""
    values = [record.get(f) for f in fields]
    if isinstance(values[0], list):
        return list(zip(*values))
    return [tuple(values)]


def _dp_audit(records: list[tuple[float, float]], summary: dict) -> dict:
    privacy = summary.get("privacy") or {}
    z, clip, q = privacy.get("noise_multiplier"), privacy.get("clip"), privacy.get("sample_rate")
    k = int(privacy.get("num_directions") or 1)
    if z is None or clip is None or q is None:
        raise ValueError("summary.json gives no noise multiplier, clip or sample rate: the DP coefficients cannot "
                         "be checked")
    on = sum(dp_coefficient_on_grid(float(c), float(sigma), float(z), float(clip), float(q), k)
             for c, sigma in records)
    return {"kind": "dp", "releases": len(records), "decided": 0, "off_grid": len(records) - on, "excluded_both": 0,
            "sampler": "none" if not records else "grid" if on == len(records) else "float" if on == 0 else "mixed"}


def audit_transcript(run_dir: str | Path) -> dict:
    """The last-bits attack on every noised release in ``RUN/log.jsonl`` (public values only).

    Returns ``{"releases": n, "decided": d, "excluded_both": e, "sampler": ...}``: ``decided`` counts
    releases whose published value only one sign can produce (each gives the secret sign away).
    """
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        raise ValueError(f"{run_dir}: no log.jsonl (not a paczero run folder)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    dp = [(c, s) for r in records if "step" in r for b, c, s in _each(r, "branch", "coef", "sigma")
          if b == "dp" and c is not None]
    if dp:
        summary = Path(run_dir) / "summary.json"
        if not summary.is_file():
            raise ValueError(f"{run_dir}: no summary.json (the DP run has not finished and published)")
        return _dp_audit(dp, json.loads(summary.read_text()))
    releases = decided_n = both = on_grid = 0
    for record in records:
        if "step" not in record or record.get("y_tilde") is None:
            continue
        for y, sigma, grid in _pac_values(record):
            plus, minus = pac_release_consistency(float(y), float(sigma), float(grid))
            releases += 1
            on_grid += bool(grid)
            decided_n += decided(plus, minus)
            both += not (plus or minus)
    sampler = "none" if not releases else ("grid" if on_grid == releases else
                                           "float" if on_grid == 0 else "mixed")
    return {"kind": "pac", "releases": releases, "decided": decided_n, "excluded_both": both, "sampler": sampler}


def format_transcript_audit(result: dict) -> str:
    """One paragraph for the console."""
    n, d = result["releases"], result["decided"]
    if n == 0:
        return "last-bits attack: the run published no noised value (nothing to attack)"
    kind = {"grid": "exact discrete noise on a grid", "float": "float noise",
            "mixed": "float and grid noise"}[result["sampler"]]
    if result.get("kind") == "dp":
        off = result["off_grid"]
        if not off:
            return (f"last-bits attack ({kind}): {n} of {n} released coefficients are the image of an integer noisy "
                    f"sum, which the sums with and without any record reach alike: none can be decided")
        return (f"last-bits attack ({kind}): {off} of {n} released coefficients are not the image of an integer "
                f"noisy sum (float noise): an adversary who knows the other records can test both hypotheses (a "
                f"record in the batch or not) on their last bits")
    line = (f"last-bits attack ({kind}): {d} of {n} noised releases decided "
            f"({100.0 * d / n:.1f} %): only one sign of s_j* can produce the published value exactly")
    if d:
        line += "; each decided release gives the secret sign away, beyond what the MI budget states"
    if result["excluded_both"]:
        line += f"; {result['excluded_both']} value(s) neither sign produces (not made by this sampler)"
    return line
