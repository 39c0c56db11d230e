"""The zeroth-order step: public directions, exact perturbation, per-sample scalars, update.

Algorithm 1, lines 1-5 and 15 of the paper. The direction z_t ~ N(0, I_d) is
public and never stored for full fine-tuning (MeZO's trick): it is regenerated
from seeds that depend only on the public seed, the step, the direction index
k and the parameter's position, so every rank of a data-parallel run
regenerates the same z.

The parts, each in the file named after it:

* :mod:`.directions`: how z is defined and drawn. For trainable parameter i, z is
  the concatenation along the parameter's first dimension of independent
  *chunks* of whole rows, about ``chunk_values(device)`` values each (2^14 on
  CPU, 2^24 on accelerators); chunk c is drawn from the chunk seed
  ``chunk_seeds(direction_seed(seed, step, k, i))[c]``: on CPU by torch's
  generator seeded with it (``torch.randn`` per chunk), on CUDA by the fused
  Triton kernels of :mod:`paczero.zo.cuda_directions`, which compute a Philox
  stream where it is used (no z is stored there; without Triton, or with
  ``PACZERO_TORCH_DIRECTIONS=1``, torch's generator per chunk there too).
  :attr:`Perturber.directions` names the generator; a run records it. Chunks
  let CPU threads fill one direction in parallel, let an embedding draw only
  the rows a batch looks up, and let a large LM head be perturbed block by
  block, so no full-size copy of it ever exists. (The chunk size and the
  generator depend on the device type: a run resumed on another kind of device
  continues with other, equally public, directions.)
* :mod:`.perturb`: the :class:`Perturber` (construction, the step's cache of z,
  :meth:`~Perturber.perturbed` blocks and :meth:`~Perturber.evaluate`).
* :mod:`.layers`: the perturbed value and the per-layer evaluation paths.
* :mod:`.lockstep`: module forwards rerouted for a block; jobs in lock-step.
* :mod:`.update`: the update along z.
* :mod:`.step`: the per-sample two-point scalars, the lock-step waves, the clip.

Exact restoration. MeZO perturbs in place (+mu z, -2 mu z, +mu z) and, in
fp16/bf16, the weights drift from their original values. Here the original
parameter tensors are never modified during the two-point evaluation: the
perturbed value ``theta +/- mu z`` (computed as ``fl(fl(z * s) + theta)``, then
rounded to the parameter's dtype) is swapped in for one module call and the
original is swapped back, so restoration is bit-exact by construction.

Evaluation paths, one arithmetic (bit-identical results, tested):

* cached (LoRA, tiny models: at most ``cache_limit`` trainable values): z is
  cached for the step and reused by the update; the perturbed tensors are
  swapped in once per ± block, except a trained embedding's (full fine-tuning),
  whose forwards perturb only the looked-up rows of the cached z;
* uncached (full fine-tuning): while a block is open, the forward of every
  module that owns trainable parameters is rerouted: it evaluates the module
  with the perturbed tensor, never writing to the parameter. Linear layers
  write their product straight into the output; an embedding larger than
  ``big_values`` draws only the rows of z that the batch looks up and a larger
  Linear (the tied LM head) is evaluated in blocks of output rows, so no
  full-size perturbed copy of either ever exists;
* lock-step (uncached, ``Perturber.evaluate`` with several jobs; the default):
  the + and - forwards of a *wave* of micro-batches (as many consecutive ones
  as fit in ``lockstep`` token budgets per sign, or ``lockstep`` of them when
  no budget is given) run as greenlets on the calling thread. Each parks at
  every rerouted module; when all have arrived, the module's z is drawn *once*
  and the module is evaluated for every job at its own sign. Without a stored
  z a step draws (2B + 1)·d Gaussian values for B micro-batches; lock-step
  draws (W + 1)·d for W waves, and each job keeps its own micro-batch shape
  (so its arithmetic, and result, are unchanged).

What code outside imports is re-exported here. A test that replaces a module-level
name must replace it in the module that looks it up: ``two_point_scalars`` here
(the training code imports it from ``paczero.zo`` when it calls it), the others in
their own file (``paczero.zo.layers._perturb``, ``paczero.zo.perturb.refuse_offloaded``,
``paczero.zo.perturb.DEFAULT_CACHE_LIMIT``, ``paczero.zo.directions._FEW_CHUNKS``, ...).
"""

from paczero.zo.directions import ChunkLayout, chunk_seeds, chunk_values, direction_seed  # noqa: F401
from paczero.zo.layers import _perturb  # noqa: F401
from paczero.zo.perturb import (  # noqa: F401
    ACCELERATOR_BIG_VALUES,
    DEFAULT_BIG_VALUES,
    DEFAULT_CACHE_LIMIT,
    DEFAULT_LOCKSTEP,
    Perturber,
    refuse_offloaded,
)
from paczero.zo.step import StepResult, lockstep_waves, stability_clip, two_point_scalars, zo_step  # noqa: F401

__all__ = ["ACCELERATOR_BIG_VALUES", "DEFAULT_BIG_VALUES", "DEFAULT_CACHE_LIMIT", "DEFAULT_LOCKSTEP",
           "ChunkLayout", "Perturber", "chunk_seeds", "chunk_values", "direction_seed", "lockstep_waves",
           "refuse_offloaded", "stability_clip", "StepResult", "two_point_scalars", "zo_step"]
