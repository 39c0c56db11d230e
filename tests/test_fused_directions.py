"""z on CUDA (paczero/zo/cuda_directions.py): its definition, and the fused kernels that compute it.

The reference generator is checked against Philox's published known answers; the
kernels against the reference in Triton's CPU interpreter (where Triton is
installed: scripts/test.sh installs it) in fp32 and fp16, whose conversions the
interpreter rounds as a GPU does (its bf16 conversion truncates, so bf16 is
checked on a GPU: tests/test_cuda.py).
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy import stats

from paczero.zo.cuda_directions import philox4x32_10, reference_values


def test_reference_philox_matches_the_published_known_answers():
    """Random123's known-answer vectors for Philox4x32-10 (zero, all-ones, and pi's digits)."""
    cases = [
        (0, (0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        (0xFFFFFFFFFFFFFFFF, (0xFFFFFFFF,) * 4, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (0x299F31D0A4093822, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for key, ctr, expected in cases:
        out = philox4x32_10(key, np.array([ctr[0]]), *ctr[1:])
        assert tuple(int(x[0]) for x in out) == expected
    # a negative control: the key's words the other way round give another stream
    key, ctr, expected = cases[2]
    swapped = ((key & 0xFFFFFFFF) << 32) | (key >> 32)
    assert tuple(int(x[0]) for x in philox4x32_10(swapped, np.array([ctr[0]]), *ctr[1:])) != expected

def test_reference_values_are_standard_normal_and_laid_out_by_block():
    z = reference_values(12345, np.arange(200_000))
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01 and np.abs(z).max() <= np.sqrt(-2 * np.log(2.0 ** -24))
    # chunk seeds give independent streams; the value at an offset does not depend on the offsets asked with it
    assert not np.allclose(reference_values(12346, np.arange(1000)), z[:1000])
    assert np.array_equal(reference_values(12345, np.array([4095, 7, 1024])), z[[4095, 7, 1024]])


_INTERPRETED = textwrap.dedent('''
    import numpy as np, torch
    from paczero.zo import cuda_directions as cd
    from paczero.zo import Perturber, chunk_seeds, _perturb
    assert cd.enabled("cpu")
    seeds_np = chunk_seeds(77, 3)
    sd = cd.seeds_tensor(seeds_np, "cpu")
    rows, cols, per_chunk = 30, 100, 13          # three chunks, the last partial, blocks not row-aligned
    numel, CH = rows * cols, per_chunk * cols
    z = torch.empty(rows, cols)
    cd.chunks(sd, CH, numel, 0, 3, mode=cd.MODE_Z, out1=z)
    flat = z.view(-1).double().numpy()
    for c in range(3):
        n = min(CH, numel - c * CH)
        ref = cd.reference_values(int(seeds_np[c]), np.arange(n))
        assert np.abs(flat[c * CH:c * CH + n] - ref).max() < 4e-6, c
        # negative control: the same Philox outputs in another order are not z
        i1, i2, _, _ = cd.philox4x32_10(int(seeds_np[c]), np.arange(n) // 4)
        other = np.sqrt(-2 * np.log(((i1 >> 8) + 1.0) * 2.0 ** -24)) * np.cos(2 * np.pi * (i2 >> 8) * 2.0 ** -24)
        assert np.abs(flat[c * CH:c * CH + n] - other).max() > 0.5
    part = torch.empty(rows - per_chunk, cols)
    cd.chunks(sd, CH, numel, 1, 3, mode=cd.MODE_Z, out1=part)
    assert torch.equal(part, z[per_chunk:])
    idx = torch.tensor([0, 12, 13, 29, 5, 5])
    assert torch.equal(cd.rows(sd, per_chunk, cols, idx), z[idx])
    sd2 = cd.seeds_tensor(chunk_seeds(78, 3), "cpu")
    z2 = torch.empty_like(z)
    cd.chunks(sd2, CH, numel, 0, 3, mode=cd.MODE_Z, out1=z2)
    for dt in (torch.float32, torch.float16):
        theta = torch.randn(rows, cols).to(dt)
        plus, minus, one = (torch.empty_like(theta) for _ in range(3))
        cd.chunks(sd, CH, numel, 0, 3, mode=cd.MODE_PAIR, out1=plus, out2=minus, theta=theta, scale=1e-3)
        cd.chunks(sd, CH, numel, 0, 3, mode=cd.MODE_PERTURB, out1=one, theta=theta, scale=-1e-3)
        assert torch.equal(plus, _perturb(z, 1e-3, theta)) and torch.equal(minus, _perturb(z, -1e-3, theta))
        assert torch.equal(one, minus)
        th = theta.clone()
        cd.update(torch.stack([sd, sd2]), torch.tensor([0.5, -0.25]), CH, th, 0.99)
        assert torch.equal(th, (((theta.float() * 0.99) - z * 0.5) - z2 * -0.25).to(dt)), dt

    # the Perturber's fused paths against its cached (whole z, torch arithmetic) path
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 24), torch.nn.Linear(24, 40))
    params = list(model.named_parameters())
    fused = Perturber(model, params, public_seed=3, cache_limit=0, big_values=100)
    cached = Perturber(model, params, public_seed=3, cache_limit=1 << 30)
    assert all(fused._fused) and cached.cache
    for i, (_, p) in enumerate(params):
        zc = cached.direction(2, 0, i)
        assert torch.equal(fused.direction(2, 0, i), zc)
        vals = fused._fused_values(p, p.data, 2, 0, [1e-2, -1e-2], "s")
        assert torch.equal(vals[1e-2], _perturb(zc, 1e-2, p.data))
        assert torch.equal(vals[-1e-2], _perturb(zc, -1e-2, p.data))
        r = torch.tensor([p.shape[0] - 1, 0, 3])
        assert torch.equal(fused.direction_rows(2, 0, i, r), zc[r])
    ids = torch.tensor([[1, 5, 63], [2, 2, 0]])
    for scale in (1e-2, -1e-2):
        with fused.perturbed(2, 0, scale):
            a = model(ids)
        with cached.perturbed(2, 0, scale):
            b = model(ids)
        assert torch.allclose(a, b, atol=1e-6)
    before = [p.detach().clone() for _, p in params]
    fused.apply_update(2, [1.0, -2.0], lr=0.1, weight_decay=0.5)
    after = [p.detach().clone() for _, p in params]
    for (_, p), b in zip(params, before):
        p.data.copy_(b)
    cached.apply_update(2, [1.0, -2.0], lr=0.1, weight_decay=0.5)
    assert all(torch.equal(p.detach(), x) for (_, p), x in zip(params, after))

    # lock-step waves: small tensors (the bias, the layer norm) keep their perturbed copies from the first
    # wave to the update; every wave, and the same step after an update, matches the cached path
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 24), torch.nn.LayerNorm(24), torch.nn.Linear(24, 40))
    params = list(model.named_parameters())
    fused = Perturber(model, params, public_seed=5, cache_limit=0, big_values=100, lockstep=1)
    cached = Perturber(model, params, public_seed=5, cache_limit=1 << 30)
    waves = [torch.tensor([[1, 5, 63]]), torch.tensor([[2, 2, 0], [7, 8, 9]]), torch.tensor([[4, 4, 4]])]
    def scores(pert, step):
        return [pert.evaluate(step, 0, [(1e-2, lambda x=x: model(x)), (-1e-2, lambda x=x: model(x))])
                for x in waves]
    def same(a, b):
        return all(torch.equal(u, v) for pa, pb in zip(a, b) for u, v in zip(pa, pb))
    assert same(scores(fused, 4), scores(cached, 4)) and fused._small_copies   # kept after the first wave, reused
    start = [p.detach().clone() for _, p in params]
    stale = dict(fused._small_copies)
    fused.apply_update(4, [3.0], lr=0.5)
    cached.apply_update(4, [3.0], lr=0.5)
    assert not fused._small_copies and same(scores(fused, 4), scores(cached, 4))
    # negative control: copies kept across the update would score the weights before it
    fused.apply_update(4, [0.0], lr=0.5, weight_decay=0.0)
    fused._small_copies, fused._small_copies_for = stale, (4, 0)
    assert not same(scores(fused, 4), scores(cached, 4))
    assert not any(torch.equal(p.detach(), b) for (_, p), b in zip(params, start))
    print("ok")
''')


@pytest.mark.slow
def test_fused_kernels_compute_the_definition_in_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PACZERO_TRITON_CPU="1")
    env.pop("PACZERO_TORCH_DIRECTIONS", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
