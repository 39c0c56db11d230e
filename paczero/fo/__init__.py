"""First-order steps: DP-SGD with Opacus per-sample gradients (:mod:`paczero.fo.dpsgd_step`)."""
