"""Model FLOPs utilisation (MFU): a step's useful model FLOPs per second over the machine's matmul rate.

What is counted (:data:`FLOPS_COUNTED`, also written into every row of ``paczero bench --json-out``): for one
forward over a set of micro-batches,

    2 × P × (real tokens) + 4 × L × d × Σ_rows T_row²

where P is the model's non-embedding parameters (every parameter except the token and position embedding
tables and the LM head, and except LoRA adapters: the base model's weights, biases and norms), the real tokens
are those the attention mask keeps (padding is not useful work), L the layers, d the attention width (heads ×
head size, the hidden size on most models), and T_row a row's real tokens: the two attention products
(scores and their weighted values), each counted in full over the T² pairs of a row, the causal half included,
as most MFU figures count it. Not counted: the LM head (paczero projects only the answer positions, or for
single-token options only those options' rows), the embedding look-ups, softmax, norms' and activations'
elementwise work, the LoRA adapters, the perturbation of the weights. A zeroth-order step runs
2 × K forwards (+ and − along each of K directions) over the universe; its floor, one.

The rate it is divided by is measured in the same process, on the same device, dtype and threads: the best
of a few timed groups of ``torch.matmul`` at 2048 × 2048 × 2048, and at the model's own shape (the median
micro-batch's padded tokens × hidden size, times hidden × intermediate size: the MLP's first product).
"""
from __future__ import annotations

import statistics
import time

#: what a row's ``forward_flops`` counts (the module docstring, in one line)
FLOPS_COUNTED = ("2 x non-embedding parameters (embedding tables, LM head and LoRA adapters excluded) x real "
                 "(non-pad) tokens + 4 x layers x attention width x sum over rows of real tokens squared; "
                 "a zeroth-order step is 2 x K forwards")
#: the square matmul every row is also measured against
SQUARE = 2048


def non_embedding_parameters(model) -> int:
    """The parameters of ``model`` (a peft wrapper or a Hugging Face model) outside its embedding tables
    (``nn.Embedding``, position embeddings included) and its LM head, LoRA adapters left out; a tied head
    is the embedding table, counted once and excluded."""
    import torch

    from paczero.models import hf_model

    hf = hf_model(model)
    skip = {id(p) for m in hf.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if head is not None:
        skip |= {id(p) for p in head.parameters()}
    seen, total = set(), 0
    for name, p in hf.named_parameters():
        if id(p) in skip or id(p) in seen or "lora_" in name:
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def model_shape(model) -> tuple[int, int, int, int]:
    """(layers, hidden size, attention width, intermediate size) from the model's config."""
    from paczero.models import hf_model

    c = hf_model(model).config
    c = c.get_text_config() if hasattr(c, "get_text_config") else c
    hidden = c.hidden_size
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    inter = next((v for v in (getattr(c, k, None) for k in ("intermediate_size", "ffn_dim", "n_inner")) if v),
                 4 * hidden)
    return c.num_hidden_layers, hidden, heads * head_dim, inter


def forward_flops(model, batches) -> int:
    """The useful FLOPs of one forward over ``batches`` (objects with an ``attention_mask``), as counted above."""
    layers, _, width, _ = model_shape(model)
    params = non_embedding_parameters(model)
    total = 0
    for b in batches:
        real = b.attention_mask.sum(dim=1).long()
        total += 2 * params * int(real.sum()) + 4 * layers * width * int((real * real).sum())
    return total


def matmul_tflops(m: int, k: int, n: int, *, dtype, device, min_s: float = 0.25, groups: int = 3) -> float:
    """TFLOP/s of ``[m, k] @ [k, n]`` in ``dtype`` on ``device``: after a warm-up, groups of products (each
    group long enough to time, at least ``groups`` of them and ``min_s`` seconds in all), the best group."""
    import torch

    dev = torch.device(device)
    a, b = torch.randn(m, k, device=dev).to(dtype), torch.randn(k, n, device=dev).to(dtype)
    out = torch.empty(m, n, device=dev, dtype=dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def group(reps: int) -> float:
        sync()
        t = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        sync()
        return (time.perf_counter() - t) / reps

    with torch.inference_mode():
        group(1)  # warm-up
        reps = 1
        while (per := group(reps)) * reps < 0.02 and reps < 1 << 16:  # enough products to time a group
            reps *= 2
        times, spent = [per], per * reps
        while len(times) < groups or spent < min_s:
            times.append(group(reps))
            spent += times[-1] * reps
    return 2 * m * k * n / min(times) / 1e12


def matmul_rates(model, batches, dtype, device) -> dict:
    """The matmul rates a row's MFU divides by: at :data:`SQUARE`³ and at the model's own shape."""
    _, hidden, _, inter = model_shape(model)
    tokens = int(statistics.median(b.attention_mask.numel() for b in batches))
    shape = (tokens, hidden, inter)
    return {"matmul_tflops_2048": matmul_tflops(SQUARE, SQUARE, SQUARE, dtype=dtype, device=device),
            "matmul_shape": list(shape),
            "matmul_tflops_shape": matmul_tflops(*shape, dtype=dtype, device=device)}


def utilisation(flops: int, seconds: float, rates: dict) -> dict:
    """``tflops`` done, and MFU against the 2048³ rate (``mfu``) and the model-shape rate (``mfu_shape``)."""
    tflops = flops / seconds / 1e12
    return {"tflops": tflops, "mfu": tflops / rates["matmul_tflops_2048"],
            "mfu_shape": tflops / rates["matmul_tflops_shape"]}


def mfu_figures(h, step_s: float, floor_s: float | None = None) -> dict:
    """A zeroth-order row's MFU fields: the step's (2 × K forwards) and, given ``floor_s``, the floor's (one
    forward), with what they count and the rates they divide by. ``h``: the benchmark's
    :class:`~paczero.bench.harness.Harness`."""
    from paczero.models import DTYPES

    forward = forward_flops(h.model, h.batches)
    rates = matmul_rates(h.model, h.batches, DTYPES[h.cfg.dtype], h.cfg.device)
    step = utilisation(2 * h.cfg.num_directions * forward, step_s, rates)
    res = {"flops_counted": FLOPS_COUNTED, "non_embedding_params": non_embedding_parameters(h.model),
           "forward_flops": forward, "step_flops": 2 * h.cfg.num_directions * forward, **rates,
           "step_tflops": step["tflops"], "mfu": step["mfu"], "mfu_shape": step["mfu_shape"]}
    if floor_s is not None:
        floor = utilisation(forward, floor_s, rates)
        res.update(floor_tflops=floor["tflops"], floor_mfu=floor["mfu"], floor_mfu_shape=floor["mfu_shape"])
    return res


def first_order_flops(forward: int, track: str) -> int:
    """A first-order (DP-SGD) step's useful FLOPs from its forward's: the forward and the backward through the
    activations (2 × P a token: LoRA's frozen weights need no gradient of their own), and for full
    fine-tuning the weights' gradients too (2 × P more): 3 × forward (FT), 2 × forward (LoRA). Opacus's
    per-example gradients, clipping and noise are not counted."""
    return (3 if track == "ft" else 2) * forward


def mfu_line(res: dict) -> str:
    """The log line of a row's MFU."""
    m, k, n = res["matmul_shape"]
    floor = f"; floor {res['floor_mfu']:.1%}" if "floor_mfu" in res else ""
    return (f"  MFU     step {res['mfu']:.1%} of the {SQUARE}^3 matmul rate ({res['step_tflops']:.3f} of "
            f"{res['matmul_tflops_2048']:.3f} TFLOP/s), {res['mfu_shape']:.1%} of the {m}x{k}x{n} rate "
            f"({res['matmul_tflops_shape']:.3f}){floor}")
