"""paczero: PAC-private zeroth-order fine-tuning of language models.

The command line is ``paczero`` (:mod:`paczero.cli`); the Python API is :class:`PACZeroTrainer`
(:mod:`paczero.api`), and :func:`paczero.train.train` runs one configuration (:class:`TrainConfig`).
The names below load on first use, so that ``import paczero`` stays cheap.
"""

_EXPORTS = {"PACZeroTrainer": "paczero.api", "TrainResult": "paczero.api",
            "TrainConfig": "paczero.config", "ConfigError": "paczero.config"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'paczero' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
