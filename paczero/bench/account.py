"""Where a forward's time goes: ``paczero bench --account``, a measured account of one floor pass.

One inference pass over the benchmark's floor micro-batches (the same work as
:meth:`~paczero.bench.harness.Harness.floor_pass`: ``task.losses`` under ``torch.inference_mode``) runs with a
forward pre-hook and a forward hook on every ``torch.nn.Module`` of the model, each reading
``time.perf_counter`` (on CUDA after ``torch.cuda.synchronize()``, which serialises the device with the host
and so slows the pass: the account then says where the time goes once nothing overlaps). A stack of the calls
in progress gives each call's *inclusive* time and its *exclusive* time: inclusive minus the inclusive times
of the timed calls directly nested in it. The exclusive times are summed into :data:`CATEGORIES` by the
module's type and name (Llama-style and OPT-style models, with or without peft LoRA wrappers):

- base linear (matmul): ``nn.Linear`` modules that are neither LoRA adapters nor the LM head;
- LoRA adapters: the ``lora_A`` / ``lora_B`` linears, ``lora_dropout``, and the peft wrapper's own exclusive
  time (its scaling and add); the wrapped ``base_layer`` is a base linear;
- attention core: the attention modules' exclusive time (rotary application, scores, softmax, weighted
  values, head reshapes) and the rotary-embedding modules';
- norms: ``LayerNorm`` and ``*RMSNorm`` / ``*Norm`` modules;
- MLP activation and gating: the MLP modules' exclusive time (the gate product) and activation modules';
- embedding: ``nn.Embedding`` modules (position embeddings too) called inside the model;
- layer glue: the decoder layers' and the base model's exclusive time (residual adds, masks, reshapes), and
  any other module (dropout, wrappers);
- LM head / answer logits: the output-embedding module, and an embedding module called outside every other
  module (a tied head's option rows, :func:`paczero.tasks.batching.token_logits`);
- outside the model: the pass's wall time minus the inclusive times of the top-level module calls (moving
  the batches, slicing, the logits of the option rows, the task's loss).

The categories partition the pass's wall time: their sum is ``total_s``. The hooks cost time of their own,
which lands in the enclosing modules' exclusive time (attention core, MLP, glue) and in ``total_s``: the same
pass timed without hooks beside it (``unhooked_s``) shows how much. The base linears' FLOPs are counted
from each call's input (2 × in features × out features × rows multiplied, padding included), so
``matmul_tflops`` is the rate the model's own products reached inside the pass.
"""
from __future__ import annotations

import time

BASE_LINEAR = "base linear (matmul)"
LORA = "LoRA adapters"
ATTENTION = "attention core (rotary, scores, softmax, values)"
NORMS = "norms"
MLP = "MLP activation and gating"
EMBEDDING = "embedding"
GLUE = "layer glue (residual adds, reshapes)"
HEAD = "LM head / answer logits"
OUTSIDE = "outside the model (batching, task loss)"
#: the account's categories, in the order of the printed table
CATEGORIES = (BASE_LINEAR, LORA, ATTENTION, NORMS, MLP, EMBEDDING, GLUE, HEAD, OUTSIDE)

#: activation modules that are not named ``*Activation`` (transformers' are, e.g. ``SiLUActivation``)
_ACTIVATIONS = ("ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Mish", "Softplus", "Hardswish", "Swish", "QuickGELU")


def category(name: str, module, head=None) -> str:
    """The account's category of ``module`` (called ``name`` in the model; ``head``: the model's output
    embedding). An embedding module called outside every other module is the LM head's instead: that is
    decided per call, by :func:`floor_account`."""
    import torch

    kind = type(module).__name__
    if any(part.startswith("lora_") for part in name.split(".")) or _is_lora_wrapper(module):
        return LORA
    if head is not None and module is head:
        return HEAD
    if isinstance(module, torch.nn.Linear):
        return BASE_LINEAR
    if isinstance(module, torch.nn.Embedding) or kind.endswith(("PositionalEmbedding", "PositionEmbedding")):
        return EMBEDDING
    if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or kind.endswith("Norm"):
        return NORMS
    if "Attention" in kind or "Rotary" in kind:
        return ATTENTION
    if kind.endswith("MLP") or kind.endswith("Activation") or kind in _ACTIVATIONS:
        return MLP
    return GLUE


def _is_lora_wrapper(module) -> bool:
    """A peft LoRA layer wrapping a base layer (``lora.Linear``: ``base_layer``, ``lora_A``, ``lora_B``)."""
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "lora_B")


def _input_rows(args, kwargs):
    """The rows a linear's call multiplies (every position of its input, padded ones too); None where the
    call holds no input tensor."""
    import torch

    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or x.ndim == 0:
        return None
    return x.numel() // x.shape[-1]


def floor_account(h) -> dict:
    """The account of one floor pass of the benchmark's :class:`~paczero.bench.harness.Harness` ``h`` (module
    docstring), as a JSON-able dict: ``categories`` (seconds, summing to ``total_s``), ``shares`` (of
    ``total_s``), ``total_s`` (the hooked pass's wall time), ``modules_s`` (the top-level module calls'
    inclusive time), ``unhooked_s`` (the same pass without hooks, timed just before), ``hook_overhead``
    (``total_s / unhooked_s - 1``), ``module_calls`` and ``hook_calls`` (two per call), ``matmul_flops`` and
    ``matmul_tflops`` (the base linears'), and ``by_type`` (exclusive seconds per module class)."""
    import torch

    from paczero.models import hf_model

    hf = hf_model(h.model)
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    cuda = str(h.cfg.device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else None
    clock = time.perf_counter
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    by_type: dict[str, float] = {}
    stack: list[list] = []  # [module, start, inclusive time of the directly nested calls]
    totals = {"top": 0.0, "calls": 0, "flops": 0}

    def hooks(name: str, module):
        cat = category(name, module, head)
        kind = type(module).__name__
        answer_rows = cat == EMBEDDING and isinstance(module, torch.nn.Embedding)
        per_row = 2 * module.in_features * module.out_features if cat == BASE_LINEAR else 0

        def pre(mod, args, kwargs):
            if per_row:
                rows = _input_rows(args, kwargs)
                if rows is None:
                    raise RuntimeError(f"account: {name} was called without an input tensor to count")
                totals["flops"] += per_row * rows
            if sync:
                sync()
            stack.append([mod, clock(), 0.0])

        def post(mod, args, kwargs, out):
            if sync:
                sync()
            end = clock()
            frame = stack.pop()
            if frame[0] is not mod:
                raise RuntimeError(f"account: {name} ended while {type(frame[0]).__name__} was running")
            inclusive = end - frame[1]
            exclusive = inclusive - frame[2]
            where = HEAD if answer_rows and not stack else cat
            seconds[where] += exclusive
            by_type[kind] = by_type.get(kind, 0.0) + exclusive
            totals["calls"] += 1
            if stack:
                stack[-1][2] += inclusive
            else:
                totals["top"] += inclusive

        return pre, post

    h.floor_pass()  # warm-up
    unhooked = h.floor_pass()
    handles = []
    try:
        for name, module in h.model.named_modules():
            pre, post = hooks(name, module)
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
            handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
        total = h.floor_pass()
    finally:
        for handle in handles:
            handle.remove()
    if stack:
        raise RuntimeError(f"account: {len(stack)} module calls never ended")
    seconds[OUTSIDE] = total - totals["top"]
    linear_s = seconds[BASE_LINEAR]
    return {"categories": seconds, "shares": {k: v / total for k, v in seconds.items()}, "total_s": total,
            "modules_s": totals["top"], "unhooked_s": unhooked, "hook_overhead": total / unhooked - 1,
            "module_calls": totals["calls"], "hook_calls": 2 * totals["calls"], "synchronized": cuda,
            "matmul_flops": totals["flops"],
            "matmul_tflops": totals["flops"] / linear_s / 1e12 if linear_s > 0 else None,
            "by_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1]))}


def account_line(acc: dict) -> str:
    """The log line of an account."""
    return (f"  account floor pass {acc['total_s']:.4f}s with hooks ({acc['hook_calls']} hook calls), "
            f"{acc['unhooked_s']:.4f}s without (+{acc['hook_overhead']:.1%}); base linear "
            f"{acc['shares'][BASE_LINEAR]:.1%}"
            + (f" at {acc['matmul_tflops']:.3f} TFLOP/s" if acc["matmul_tflops"] else ""))


def account_table(results: list[dict]) -> str:
    """The accounts of the rows that have one, one small table each: category, seconds, share of the pass,
    and for the base linears their TFLOP/s, also as a share of the row's measured matmul rates."""
    out = []
    for r in results:
        acc = r.get("account")
        if not acc:
            continue
        c = r["config"]
        out.append(f"\naccount of the floor pass: {c['model']} {c['track']} {c['dtype']} N={c['n']}: "
                   f"{acc['total_s']:.4f}s with {acc['hook_calls']} hook calls, {acc['unhooked_s']:.4f}s "
                   f"without hooks (hooks +{acc['hook_overhead']:.1%})")
        head = ("category", "s", "share", "TFLOP/s", "% of shape rate", "% of 2048^3 rate")
        rows = []
        for cat in CATEGORIES:
            cells = [cat, f"{acc['categories'][cat]:.4f}", f"{acc['shares'][cat]:.1%}", "", "", ""]
            if cat == BASE_LINEAR and acc["matmul_tflops"]:
                rate = acc["matmul_tflops"]
                cells[3] = f"{rate:.4g}"
                if r.get("matmul_tflops_shape"):
                    cells[4] = f"{rate / r['matmul_tflops_shape']:.1%}"
                if r.get("matmul_tflops_2048"):
                    cells[5] = f"{rate / r['matmul_tflops_2048']:.1%}"
            rows.append(cells)
        rows.append(["total", f"{acc['total_s']:.4f}", f"{sum(acc['shares'].values()):.1%}", "", "", ""])
        widths = [max(len(x), *(len(row[i]) for row in rows)) for i, x in enumerate(head)]
        line = lambda cells: "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"  # noqa: E731
        out += [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]
    return "\n".join(out)
