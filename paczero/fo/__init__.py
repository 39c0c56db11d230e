"""First-order steps: DP-SGD with Opacus per-sample gradients (:mod:`paczero.fo.dpsgd_step`) and the
non-private AdamW reference (:mod:`paczero.fo.adamw_step`)."""
from __future__ import annotations


def attach(cfg, ranks, setup, params, run_dir=None):
    """The first-order engine of ``cfg.mechanism`` on ``setup``'s model: an object whose ``step(batches,
    mechanism=, loss_fn=, lr=, device=, step=)`` takes one step (keeping its gradient in ``run_dir``'s
    ``private/updates/`` for a resume, :mod:`paczero.fo.state`) and whose ``close()`` detaches it."""
    if cfg.mechanism == "adamw":
        from paczero.fo.adamw_step import attach as engine
    else:
        from paczero.fo.dpsgd_step import attach as engine
    fo = engine(cfg, ranks, setup, params)
    fo.run_dir = run_dir
    return fo
