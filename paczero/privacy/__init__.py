"""Privacy math of paczero: pure numpy/scipy, no torch import.

* :mod:`.binary_channel` -- the binary-input Gaussian channel MI of a PAC-MI
  release (eq. binary-mi) and its calibration ``sigma_for_mi`` (Algorithm 1).
* :mod:`.mia` -- membership-inference bounds from an MI budget (eq. pac_mi_bound)
  and the matched-MIA DP comparison points (Section 2).
* :mod:`.dp` -- DP accounting of the DP baselines.
* :mod:`.exact_noise` -- exact discrete Gaussian and Laplace samplers on a grid, the public noise scale.
* :mod:`.secure_random` -- the private generator (SHAKE-256, keyed from OS entropy).
* :mod:`.subsets` -- the M candidate subsets (balanced designs), the private and secret generators.
* :mod:`.statement` -- the privacy statement of a run, in numbers and in words.

Importing this package loads binary_channel and mia only.
"""
from .binary_channel import binary_entropy, binary_mi, sigma_for_mi
from .mia import (
    binary_kl,
    dp_epsilon_matching_mi,
    dp_mia_bound,
    mi_for_mia,
    mi_matching_dp,
    mia_bound,
)

__all__ = [
    "binary_entropy",
    "binary_mi",
    "sigma_for_mi",
    "binary_kl",
    "mia_bound",
    "mi_for_mia",
    "dp_mia_bound",
    "mi_matching_dp",
    "dp_epsilon_matching_mi",
]
