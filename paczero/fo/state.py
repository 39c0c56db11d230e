"""What a first-order run keeps so that ``--resume`` continues it exactly: AdamW's state and each step's update.

A zeroth-order step's update is its logged coefficients along public directions, so a resume rebuilds the
weights of the logged steps after the newest checkpoint from the log. A first-order step's update is a
gradient (DP-SGD: the clipped sum plus the Gaussian noise, over the public ``q n_train``, the object the DP
analysis releases; adamw: the mean gradient), which the log does not hold. So each step's gradient, as handed
to AdamW, is kept in the run's owner-only ``private/updates/`` (:func:`paczero.checkpoint.save_update`, on disk
before the step's journal line), and each checkpoint holds AdamW's moments and step counts
(``optimizer.safetensors``, mode 0600). A resume loads the newest checkpoint's weights and AdamW state and
*replays* each journaled step after it (:meth:`Resumable.replay`: the same AdamW step on the kept gradient,
bit for bit the original one) instead of executing it again: no Poisson sample and no noise is drawn twice.
The Poisson sampler's and the noise's position in the private stream and the accountant's step count are
the mechanism's state, in the journal and the checkpoint's ``private.json`` as for every mechanism.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from paczero.checkpoint import CheckpointError, load_update, save_update

#: the checkpoint's file of AdamW's state (``optimizer.safetensors``)
OPTIMIZER = "optimizer"


class Resumable:
    """The part of a first-order engine a resume needs (mixed into :class:`paczero.fo.dpsgd_step.FirstOrder` and
    :class:`paczero.fo.adamw_step.PlainFirstOrder`, which hold ``params`` and AdamW)."""

    params: list[torch.nn.Parameter]
    #: the run folder whose ``private/updates/`` keeps each step's gradient (None: nothing kept, as in a benchmark)
    run_dir: Path | None = None

    adamw: torch.optim.AdamW  # the engine's optimizer (each engine holds its own)

    def apply(self, grads: Sequence[torch.Tensor], lr: float, step: int | None = None) -> None:
        """One AdamW step at ``lr`` on ``grads`` (one tensor a parameter, in its dtype); ``step``: the run's step,
        whose gradient is kept first (on disk when this returns)."""
        if step is not None and self.run_dir is not None:
            save_update(self.run_dir, step, {str(i): g for i, g in enumerate(grads)})
        for g, p in zip(grads, self.params):
            p.grad = g
        for group in self.adamw.param_groups:
            group["lr"] = lr
        self.adamw.step()
        for p in self.params:
            p.grad = None

    def replay(self, step: int, lr: float) -> None:
        """Logged step ``step`` again from its kept gradient (no forward, no sample, no noise)."""
        kept = load_update(self.run_dir, step)
        if sorted(kept) != sorted(str(i) for i in range(len(self.params))) or any(
                kept[str(i)].shape != p.shape or kept[str(i)].dtype != p.dtype for i, p in enumerate(self.params)):
            raise CheckpointError(f"cannot resume: the kept update of step {step} does not fit the trainable "
                                  "parameters; start the run again in another folder")
        self.apply([kept[str(i)].to(p.device) for i, p in enumerate(self.params)], lr)

    def optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """AdamW's per-parameter state as the checkpoint's ``tensors``: ``{"optimizer": {"i.key": tensor}}``."""
        flat = {}
        for i, state in self.adamw.state_dict()["state"].items():
            for key, value in state.items():
                flat[f"{i}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
        return {OPTIMIZER: flat}

    def load_optimizer_state(self, private: dict, step: int) -> None:
        """AdamW's state from checkpoint ``step``'s private part; CheckpointError (one line) where it lacks it or
        it does not fit the trainable parameters."""
        flat = private.get(OPTIMIZER)
        if flat is None:
            raise CheckpointError(f"cannot resume: the checkpoint of step {step} holds no optimizer state; start "
                                  "the run again in another folder")
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in flat.items():
            index, _, key = name.partition(".")
            state.setdefault(int(index), {})[key] = value
        fits = all(0 <= i < len(self.params) and all(
            v.shape == self.params[i].shape for k, v in s.items() if k != "step") for i, s in state.items())
        if not fits or (step > 0 and len(state) != len(self.params)):
            raise CheckpointError(f"cannot resume: the optimizer state of checkpoint {step} does not fit the "
                                  "trainable parameters; start the run again in another folder")
        saved = self.adamw.state_dict()
        self.adamw.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
