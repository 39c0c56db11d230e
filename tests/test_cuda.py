"""The step on a CUDA device: exact restoration in bf16/fp16, the evaluation paths agree, training and resume.

Skipped where torch sees no CUDA device (CI has none); run on a GPU machine with
``python -m pytest tests/test_cuda.py`` (docs/performance.md, "GPU").
"""
import shutil

import numpy as np
import pytest
import torch

from paczero.config import TrainConfig
from paczero.models import load_model, trainable_parameters
from paczero.experiments.report import read_log
from paczero.tasks import build_task, load_splits
from paczero.train import train
from paczero.zo import Perturber, two_point_scalars

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _setup(name, track, dtype, n=12, token_budget=96):
    lm = load_model(name, track=track, dtype=dtype, device="cuda")
    task = build_task("demo", lm.tokenizer)
    train_ex, _, _ = load_splits("demo", n_train=n, n_dev=1, n_test=1)
    batches = task.make_batches(task.encode(train_ex), token_budget=token_budget)
    return lm, task, batches, trainable_parameters(lm.model, track)


def _scalars(lm, task, batches, params, step=1, **kw):
    pert = Perturber(lm.model, params, public_seed=4, **kw)
    g, loss = two_point_scalars(pert, step, 1, 1e-2, batches, lambda b: task.losses(lm.model, b),
                                sum(len(b.index) for b in batches), "cuda")
    return g, loss


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("track,kw", [("lora", {}), ("ft", {"cache_limit": 0, "lockstep": 0}),
                                      ("ft", {"cache_limit": 0, "lockstep": 1, "big_values": 1000}),
                                      ("ft", {})])
def test_restoration_is_bit_exact_on_cuda(dtype, track, kw):
    """Many ± evaluations and zero-lr updates leave every weight bit-identical (MeZO's fp16 drift: none)."""
    lm, task, batches, params = _setup("tiny-llama", track, dtype)
    before = [p.detach().clone() for _, p in params]
    pert = Perturber(lm.model, params, public_seed=2, token_budget=96, **kw)
    for step in range(6):
        g, _ = two_point_scalars(pert, step, 1, 1e-3, batches, lambda b: task.losses(lm.model, b), 12, "cuda")
        assert np.all(np.isfinite(g)) and np.any(g != 0)
        pert.apply_update(step, [1.0], lr=0.0)
    assert all(p.device.type == "cuda" for _, p in params)
    assert all(torch.equal(p.detach(), b) for (_, p), b in zip(params, before))
    assert all("forward" not in m.__dict__ for m in lm.model.modules())


@pytest.mark.parametrize("name,dtype", [("tiny-opt", "fp32"), ("tiny-llama", "fp32"), ("tiny-gpt2", "fp32"),
                                        ("tiny-opt", "bf16"), ("tiny-llama", "fp16")])
def test_lockstep_sequential_and_cached_agree_on_cuda(name, dtype):
    """One forward at a time and lock-step waves (both signs from one premultiplied z, row-drawn embeddings,
    blocked Linear layers) give the same scalars bit for bit (each job keeps its own shapes and kernels);
    in fp32 the cached block (whole perturbed tensors) agrees to rounding."""
    lm, task, batches, params = _setup(name, "ft", dtype)
    assert len(batches) >= 3
    ref, ref_loss = _scalars(lm, task, batches, params, cache_limit=1 << 30)
    seq, seq_loss = _scalars(lm, task, batches, params, cache_limit=0, lockstep=0)
    assert np.any(ref != 0)
    if dtype == "fp32":
        np.testing.assert_allclose(seq, ref, rtol=1e-3, atol=1e-4)
    for kw in ({"lockstep": 1}, {"lockstep": 3}, {"lockstep": 1, "token_budget": 96},
               {"lockstep": 2, "token_budget": 96}, {"lockstep": 1, "big_values": 1000}):
        g, loss = _scalars(lm, task, batches, params, cache_limit=0, **kw)
        assert np.array_equal(g, seq) and loss == seq_loss, kw


def test_update_is_theta_minus_lr_coef_z_on_cuda():
    lm, _, _, params = _setup("tiny-llama", "ft", "fp32")
    before = [p.detach().clone() for _, p in params]
    pert = Perturber(lm.model, params, public_seed=5, cache_limit=0)
    pert.apply_update(3, [1.0, -1.0], lr=0.2)
    for i, ((_, p), b) in enumerate(zip(params, before)):
        expected = b - 0.1 * (pert.direction(3, 0, i) - pert.direction(3, 1, i))
        torch.testing.assert_close(p.detach(), expected)


def test_directions_are_drawn_on_the_parameters_device_and_are_deterministic():
    lm, _, _, params = _setup("tiny-llama", "ft", "fp32")
    pert = Perturber(lm.model, params, public_seed=9, cache_limit=0)
    z1, z2 = pert.direction(4, 0, 0), pert.direction(4, 0, 0)
    assert z1.device.type == "cuda" and torch.equal(z1, z2)
    assert abs(float(z1.mean())) < 0.05 and abs(float(z1.std()) - 1.0) < 0.05
    i = max(range(len(params)), key=lambda j: params[j][1].numel())
    rows = torch.tensor([0, 5, 7, params[i][1].shape[0] - 1], device="cuda")
    assert torch.equal(pert.direction_rows(4, 0, i, rows), pert.direction(4, 0, i)[rows])


def _records(run_dir):
    """The run's public records without their timings."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in read_log(run_dir)]


@pytest.mark.parametrize("track,dtype", [("ft", "bf16"), ("lora", "fp16")])
def test_train_and_resume_on_cuda(tmp_path, track, dtype):
    """The loop end to end on the GPU; an interrupted run resumes to the uninterrupted transcript."""
    cfg = TrainConfig(model="tiny-llama", task="demo", track=track, dtype=dtype, device="cuda", n_train=16,
                      n_dev=8, n_test=8, steps=6, eval_every=3, checkpoint_every=2, num_subsets=4,
                      mechanism="pac-mi", mi_budget=0.2, progress=False, eval_zero_shot=False,
                      out_dir=str(tmp_path / "a"))
    summary = train(cfg, log=lambda *a, **k: None)
    full = _records(tmp_path / "a")
    assert [r["step"] for r in full] == list(range(6)) and 0 < summary["privacy"]["mi_spent"] <= 0.2
    shutil.rmtree(tmp_path / "a" / "checkpoints" / "step-000006")
    (tmp_path / "a" / "summary.json").unlink()
    train(cfg.replace(resume=True), log=lambda *a, **k: None)
    assert _records(tmp_path / "a") == full


@pytest.mark.parametrize("mechanism, extra", [("adamw", {"batch_size": 4}),
                                             ("dp-sgd", {"epsilon": 2.0, "sample_rate": 0.5, "dp_clip": 1.0})])
def test_first_order_steps_train_on_cuda(tmp_path, mechanism, extra):
    """The first-order engines (the non-private AdamW ceiling, DP-SGD through Opacus) end to end on the GPU: the
    trainable weights live there and move, and the run reports its test figures."""
    cfg = TrainConfig(model="tiny-llama", task="demo", track="lora", dtype="fp32", device="cuda", n_train=16,
                      n_dev=8, n_test=8, steps=3, eval_every=3, mechanism=mechanism, progress=False,
                      lr=1e-2, out_dir=str(tmp_path / "run"), private_seed=0, **extra)
    summary = train(cfg, log=lambda *a, **k: None)
    assert summary["test"]["loss"] is not None and summary["config"]["device"].startswith("cuda")
    assert len(_records(tmp_path / "run")) == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_perturbation_arithmetic_on_cuda(dtype):
    """The one arithmetic, fl(fl(z * s) + theta) rounded once to theta's dtype, on CUDA kernels too."""
    from paczero.zo import _perturb
    gen = torch.Generator(device="cuda").manual_seed(3)
    z = torch.randn(1 << 20, generator=gen, device="cuda")
    base = torch.randn(1 << 20, generator=gen, device="cuda").to(dtype)
    for s in (1e-3, -1e-3):
        assert torch.equal(_perturb(z, s, base), ((z * s) + base.float()).to(dtype))


@pytest.fixture(params=["fused", "torch"])
def direction_source(request, monkeypatch):
    """Both sources of z on CUDA: the fused Triton kernels (the default) and torch's generator."""
    if request.param == "torch":
        monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    else:
        pytest.importorskip("triton")
        monkeypatch.delenv("PACZERO_TORCH_DIRECTIONS", raising=False)
    return request.param


@pytest.mark.parametrize("name,dtype", [("tiny-opt", "bf16"), ("tiny-llama", "fp16"), ("tiny-gpt2", "fp32")])
def test_paths_agree_with_either_direction_source(direction_source, name, dtype):
    """Lock-step, blocked Linear layers, row-drawn embeddings and one forward at a time: the same scalars
    bit for bit whichever generator defines z; restoration exact; the update is theta - lr c z."""
    lm, task, batches, params = _setup(name, "ft", dtype)
    before = [p.detach().clone() for _, p in params]
    seq, _ = _scalars(lm, task, batches, params, cache_limit=0, lockstep=0)
    for kw in ({"lockstep": 1}, {"lockstep": 2, "token_budget": 96}, {"lockstep": 1, "big_values": 1000}):
        g, _ = _scalars(lm, task, batches, params, cache_limit=0, **kw)
        assert np.array_equal(g, seq), kw
    assert all(torch.equal(p.detach(), b) for (_, p), b in zip(params, before))
    pert = Perturber(lm.model, params, public_seed=5, cache_limit=0)
    assert pert._fused[0] == (direction_source == "fused")
    cached = Perturber(lm.model, params, public_seed=5, cache_limit=1 << 30)
    pert.apply_update(3, [1.0, -0.5], lr=0.2, weight_decay=0.1)
    for i, ((_, p), b) in enumerate(zip(params, before)):
        acc = b.float() * (1.0 - 0.02)
        acc = acc - cached.direction(3, 0, i) * 0.1
        acc = acc - cached.direction(3, 1, i) * -0.05
        assert torch.equal(p.detach(), acc.to(p.dtype)), i


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_kernels_match_their_definition_on_cuda(dtype, monkeypatch):
    """z against the float64 reference of its definition; the pair, single perturbation, rows and update
    kernels against torch's arithmetic on that z, bit for bit (no multiply-add fusion)."""
    from paczero.zo import cuda_directions as cd
    from paczero.zo import chunk_seeds
    pytest.importorskip("triton")
    monkeypatch.delenv("PACZERO_TORCH_DIRECTIONS", raising=False)
    rows, cols, per_chunk = 300, 1000, 128  # 3 chunks, the last partial; chunk offsets not multiples of 1024
    numel, CH = rows * cols, per_chunk * cols
    seeds_np = chunk_seeds(77, 3)
    seeds = cd.seeds_tensor(seeds_np, "cuda")
    z = torch.empty(rows, cols, device="cuda")
    cd.chunks(seeds, CH, numel, 0, 3, mode=cd.MODE_Z, out1=z)
    flat = z.view(-1).double().cpu().numpy()
    for c in range(3):
        n = min(CH, numel - c * CH)
        ref = cd.reference_values(int(seeds_np[c]), np.arange(n))
        np.testing.assert_allclose(flat[c * CH:c * CH + n], ref, rtol=0, atol=4e-6)
    part = torch.empty(rows - per_chunk, cols, device="cuda")  # chunks 1..2 alone
    cd.chunks(seeds, CH, numel, 1, 3, mode=cd.MODE_Z, out1=part)
    assert torch.equal(part, z[per_chunk:])
    theta = torch.randn(rows, cols, device="cuda").to(dtype)
    plus, minus, one = (torch.empty_like(theta) for _ in range(3))
    cd.chunks(seeds, CH, numel, 0, 3, mode=cd.MODE_PAIR, out1=plus, out2=minus, theta=theta, scale=1e-3)
    cd.chunks(seeds, CH, numel, 0, 3, mode=cd.MODE_PERTURB, out1=one, theta=theta, scale=-1e-3)
    t = z * 1e-3
    assert torch.equal(plus, torch.add(t, theta, out=torch.empty_like(theta)))
    assert torch.equal(minus, torch.sub(theta, t, out=torch.empty_like(theta)))
    assert torch.equal(one, minus)
    idx = torch.tensor([0, 127, 128, 299, 5, 5], device="cuda")
    assert torch.equal(cd.rows(seeds, per_chunk, cols, idx), z[idx])
    seeds2 = cd.seeds_tensor(chunk_seeds(78, 3), "cuda")
    z2 = torch.empty_like(z)
    cd.chunks(seeds2, CH, numel, 0, 3, mode=cd.MODE_Z, out1=z2)
    th = theta.clone()
    cd.update(torch.stack([seeds, seeds2]), torch.tensor([0.5, -0.25], device="cuda"), CH, th, 0.99)
    assert torch.equal(th, (((theta.float() * 0.99) - z * 0.5) - z2 * -0.25).to(dtype))
    # a negative control: a fused multiply-add (one rounding of theta + z m) differs somewhere in fp32
    if dtype == torch.float32:
        m = torch.tensor(1e-3, dtype=torch.float32).double()
        assert not torch.equal((theta.double() + z.double() * m).float(), plus)


def test_bench_rows_report_mfu_and_the_account_on_cuda(tmp_path, capsys):
    """``paczero bench --device cuda --account --json-out``: every row holds its MFU against the matmul rates
    measured on the GPU in the same process (mfu = step FLOPs / step seconds / the 2048³ rate), and the floor
    pass's account, whose categories add up to its total. Red if a CUDA row lacks them, divides by a rate not
    measured on the device, or the account's categories miss part of the pass."""
    import json

    from paczero.bench import main
    from paczero.bench.account import CATEGORIES

    out = tmp_path / "bench.json"
    assert main(["--model", "tiny-llama", "--track", "ft", "lora", "--n", "8", "--steps", "1", "--no-scaling",
                 "--no-memory", "--no-plain", "--device", "cuda", "--dtype", "bf16", "--account",
                 "--json-out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert len(rows) == 2 and "MFU" in printed
    for r in rows:
        assert r["matmul_tflops_2048"] > 1.0  # a GPU's bf16 rate, not a CPU's
        assert r["mfu"] == pytest.approx(r["step_flops"] / r["step_s"] / 1e12 / r["matmul_tflops_2048"])
        acc = r["account"]
        assert sum(acc["categories"][c] for c in CATEGORIES) == pytest.approx(acc["total_s"], rel=1e-6)
