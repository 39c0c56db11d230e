"""Per-step releases: PAC-MI, PAC-ZPL, the hybrid schedule, non-private references.

Every mechanism subclasses :class:`paczero.mechanisms.base.Mechanism`; build one
by name with :func:`build_mechanism`. Importing this package does not import torch.
"""
from __future__ import annotations

from typing import Any

from .base import BRANCHES, Mechanism, Release
from .hybrid import Hybrid
from .pac import PacMI, PacZPL
from .reference import MeZO, NonPrivateAdamW, QuantFull, QuantHalf, RandomSign, RawFull, RawHalf

from .dp import DPAggZO, DPZero, DPZeroAggZO1
from .dpsgd import DPSGD

#: config name -> mechanism class
MECHANISMS: dict[str, type[Mechanism]] = {
    "pac-mi": PacMI,
    "pac-zpl": PacZPL,
    "hybrid": Hybrid,
    "mezo": MeZO,
    "raw_full": RawFull,
    "quant_full": QuantFull,
    "raw_half": RawHalf,
    "quant_half": QuantHalf,
    "random_sign": RandomSign,
    "dpzero": DPZero,
    "dp-aggzo": DPAggZO,
    "dpzero-aggzo1": DPZeroAggZO1,
    "dp-sgd": DPSGD,
    "adamw": NonPrivateAdamW,
}


def build_mechanism(name: str, **kwargs: Any) -> Mechanism:
    """Construct the mechanism registered under ``name`` with the class's own arguments.

    >>> build_mechanism("pac-zpl", num_subsets=4, seed=0).name
    'pac-zpl'

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        cls = MECHANISMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown mechanism {name!r}; known: {sorted(MECHANISMS)}") from None
    return cls(**kwargs)


__all__ = [
    "BRANCHES",
    "Mechanism",
    "Release",
    "PacMI",
    "PacZPL",
    "Hybrid",
    "MeZO",
    "RawFull",
    "QuantFull",
    "RawHalf",
    "QuantHalf",
    "RandomSign",
    "DPZero",
    "DPAggZO",
    "DPZeroAggZO1",
    "DPSGD",
    "NonPrivateAdamW",
    "MECHANISMS",
    "build_mechanism",
]
