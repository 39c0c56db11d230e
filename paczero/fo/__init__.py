"""First-order steps: DP-SGD with Opacus per-sample gradients (:mod:`paczero.fo.dpsgd_step`) and the
non-private AdamW reference (:mod:`paczero.fo.adamw_step`)."""
from __future__ import annotations


def attach(cfg, ranks, setup, params):
    """The first-order engine of ``cfg.mechanism`` on ``setup``'s model: an object whose ``step(batches,
    mechanism=, loss_fn=, lr=, device=)`` takes one step and whose ``close()`` detaches it."""
    if cfg.mechanism == "adamw":
        from paczero.fo.adamw_step import attach as attach_adamw

        return attach_adamw(cfg, ranks, setup, params)
    from paczero.fo.dpsgd_step import attach as attach_dpsgd

    return attach_dpsgd(cfg, ranks, setup, params)
