"""The zeroth-order step: hook perturbation equals in-place perturbation, restoration is exact."""
import numpy as np
import pytest
import torch

from paczero.models import load_model, trainable_parameters
from paczero import zo
from paczero.zo import Perturber, direction_seed, stability_clip


def _loss(model, ids):
    logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return -logp.mean(-1)


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, 500, (3, 9), generator=g)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("track", ["ft", "lora"])
def test_hook_perturbation_equals_inplace(name, track, ids):
    lm = load_model(name, track=track)
    model = lm.model
    params = trainable_parameters(model, track)
    if track == "lora":  # LoRA B starts at zero: give it values so that A is exercised too
        with torch.no_grad():
            for n, p in params:
                p.add_(0.01 * torch.randn_like(p))
    pert = Perturber(model, params, public_seed=7)
    mu = 1e-2
    with torch.inference_mode():
        with pert.perturbed(3, 0, +mu):
            hooked = _loss(model, ids)
        before = [p.detach().clone() for _, p in params]
        for i, (_, p) in enumerate(params):
            p.data.add_(mu * pert.direction(3, 0, i))
        inplace = _loss(model, ids)
        for (_, p), b in zip(params, before):
            p.data.copy_(b)
        base = _loss(model, ids)
    assert not torch.allclose(base, inplace)  # the perturbation changes the loss
    torch.testing.assert_close(hooked, inplace, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("track", ["ft", "lora"])
def test_restoration_is_bit_exact_over_many_steps(dtype, track, ids):
    lm = load_model("tiny-llama", track=track, dtype=dtype)
    params = trainable_parameters(lm.model, track)
    before = [p.detach().clone() for _, p in params]
    pert = Perturber(lm.model, params, public_seed=1)
    with torch.inference_mode():
        for step in range(60):
            for sign in (+1, -1):
                with pert.perturbed(step, 0, sign * 1e-3):
                    _loss(lm.model, ids)
            pert.apply_update(step, [1.0], lr=0.0)
            pert.clear_cache()
    for (_, p), b in zip(params, before):
        assert torch.equal(p.detach(), b)


def test_inplace_mezo_sequence_drifts_in_bf16():
    """Negative control: MeZO's +mu z, -2 mu z, +mu z in bf16 does not restore the weights."""
    w = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    orig = w.clone()
    z = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    for _ in range(20):
        w = (w.float() + 1e-3 * z).to(torch.bfloat16)
        w = (w.float() - 2e-3 * z).to(torch.bfloat16)
        w = (w.float() + 1e-3 * z).to(torch.bfloat16)
    assert not torch.equal(w, orig)


def test_update_moves_along_z_and_k_directions_average():
    lm = load_model("tiny-llama", track="lora")
    params = trainable_parameters(lm.model, "lora")
    before = [p.detach().clone() for _, p in params]
    pert = Perturber(lm.model, params, public_seed=5)
    pert.apply_update(2, [1.0, -1.0, 1.0], lr=0.3)
    for i, ((_, p), b) in enumerate(zip(params, before)):
        expected = b - 0.1 * (pert.direction(2, 0, i) - pert.direction(2, 1, i) + pert.direction(2, 2, i))
        torch.testing.assert_close(p.detach(), expected)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_update_is_the_same_arithmetic_on_every_path(dtype):
    """theta <- fl(fl(theta (1 - lr wd)) - sum_k fl(z_k s_k)), recomputed here with torch operators from
    direction(), equals apply_update bit for bit: cached (z stored for the step, subtracted a block at a time)
    and uncached (z drawn chunk by chunk by the worker threads)."""
    lm = load_model("tiny-opt", track="ft", dtype=dtype)
    params = trainable_parameters(lm.model, "ft")
    start = [p.detach().clone() for _, p in params]
    coefs, lr, wd = [0.7, -1.3], 0.05, 0.01
    scales = [lr * c / len(coefs) for c in coefs]
    for cache_limit in (None, 0):
        for (_, p), s0 in zip(params, start):
            p.data.copy_(s0)
        pert = Perturber(lm.model, params, public_seed=8, cache_limit=cache_limit)
        assert pert.cache == (cache_limit is None)
        want = []
        for i, s0 in enumerate(start):
            acc = s0.float() * (1.0 - lr * wd)
            for k, s in enumerate(scales):
                acc = acc - pert.direction(6, k, i) * s
            want.append(acc.to(s0.dtype))
        pert.apply_update(6, coefs, lr, weight_decay=wd)
        for (name, p), w in zip(params, want):
            assert torch.equal(p.data, w), (cache_limit, name)
        assert not all(torch.equal(p.data, s0) for (_, p), s0 in zip(params, start))
    # negative control: a coefficient moved by one part in a million fails the comparison
    for (_, p), s0 in zip(params, start):
        p.data.copy_(s0)
    pert.apply_update(6, [0.7 * (1 + 1e-6), -1.3], lr, weight_decay=wd)
    assert not all(torch.equal(p.data, w) for (_, p), w in zip(params, want))


def test_directions_are_public_and_deterministic():
    assert direction_seed(1, 2, 0, 3) == direction_seed(1, 2, 0, 3)
    assert len({direction_seed(1, s, k, i) for s in range(4) for k in range(2) for i in range(3)}) == 24
    lm = load_model("tiny-opt", track="ft")
    params = trainable_parameters(lm.model, "ft")
    a = Perturber(lm.model, params, public_seed=9, cache_limit=0)
    z1 = a.direction(4, 0, 0)
    z2 = a.direction(4, 0, 0)
    assert torch.equal(z1, z2) and z1.std() > 0.5
    a.remove()


def test_direction_seeds_hash_many_parameters_as_numpys_seed_sequence_does():
    """``direction_seeds`` (every parameter of a step at once) gives, for each index, numpy's
    ``SeedSequence([seed & 0xFFFFFFFF, step, k, index, 0x7A0]).generate_state(1, uint64)`` with the top bit
    cleared, computed here by numpy itself; words of 2^32 or more take the scalar path. Red if a hash constant,
    the per-destination hashing of the fifth word or the word order of the 64-bit result is changed."""
    from paczero.zo.directions import direction_seeds

    def numpys(seed, step, k, i):
        ss = np.random.SeedSequence([seed & 0xFFFFFFFF, step, k, i, 0x7A0])
        return int(ss.generate_state(1, dtype=np.uint64)[0]) & 0x7FFFFFFFFFFFFFFF

    rng = np.random.default_rng(5)
    cases = [(0, 0, 0), (2**63 - 1, 2**32 - 1, 7), (-3, 5, 1), (2**40 + 9, 2**32, 0)]  # the last: scalar path
    cases += [(int(rng.integers(0, 2**63)), int(rng.integers(0, 2**31)), int(rng.integers(0, 9))) for _ in range(20)]
    for seed, step, k in cases:
        idx = np.concatenate([np.arange(40), rng.integers(0, 2**32, size=4)])
        got = direction_seeds(seed, step, k, idx)
        assert got.dtype == np.uint64
        assert [int(x) for x in got] == [numpys(seed, step, k, int(i)) for i in idx]
        assert [int(x) for x in got[:3]] == [direction_seed(seed, step, k, i) for i in range(3)]


def test_z_is_its_definition_chunk_by_chunk_on_every_cpu_path(monkeypatch):
    """Chunk c of z for (step, k, i) is torch's normal_ from a generator seeded with
    chunk_seeds(direction_seed(...))[c], recomputed here independently of the Perturber. The cached step's one
    draw of every tensor (split between threads), the uncached draw and the chunk seeds' two computations
    (Python integers for few chunks, numpy for many) all give it; PACZERO_TORCH_DIRECTIONS changes nothing
    on CPU."""
    from paczero.zo import directions

    for base in (0, 1, 2**63 - 1, 0x123456789ABCDEF, 2**62 + 12345):
        for n in range(1, directions._FEW_CHUNKS + 3):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(directions, "_FEW_CHUNKS", 0)
                by_numpy = zo.chunk_seeds(base, n)
            assert by_numpy.dtype == np.uint64 and np.array_equal(zo.chunk_seeds(base, n), by_numpy)
    lm = load_model("tiny-opt", track="ft")
    params = trainable_parameters(lm.model, "ft")
    cached = Perturber(lm.model, params, public_seed=21)
    uncached = Perturber(lm.model, params, public_seed=21, cache_limit=0)
    monkeypatch.setenv("PACZERO_TORCH_DIRECTIONS", "1")
    with_env = Perturber(lm.model, params, public_seed=21, cache_limit=0)
    assert cached.cache and not uncached.cache
    assert cached.directions == uncached.directions == with_env.directions == "torch generator per chunk (cpu)"
    g = torch.Generator()

    def chunk(seed: int, n: int) -> torch.Tensor:
        g.manual_seed(seed)
        return torch.empty(n).normal_(generator=g)

    for i in (0, 1, len(params) - 1, max(range(len(params)), key=lambda j: params[j][1].numel())):
        lay = cached._layouts[i]
        seeds = zo.chunk_seeds(direction_seed(21, 3, 1, i), lay.n_chunks)
        expected = torch.empty(lay.rows, lay.row)
        for c in range(lay.n_chunks):
            a, b = lay.chunk_rows(c)
            expected[a:b] = chunk(int(seeds[c]), (b - a) * lay.row).view(b - a, lay.row)
        expected = expected.view(lay.shape)
        assert torch.equal(cached.direction(3, 1, i), expected), params[i][0]
        assert torch.equal(uncached.direction(3, 1, i), expected), params[i][0]
        assert torch.equal(with_env.direction(3, 1, i), expected), params[i][0]
    assert len(cached._z_cache) == len(params)  # the first request drew every tensor of (step, k)
    wrong = zo.chunk_seeds(direction_seed(21, 3, 1, i) + 1, lay.n_chunks)  # negative control: another seed
    a, b = lay.chunk_rows(0)
    assert not torch.equal(chunk(int(wrong[0]), (b - a) * lay.row).view(b - a, lay.row),
                           expected.view(lay.rows, lay.row)[a:b])
    cached.remove()
    uncached.remove()


def test_stability_clip():
    g = np.array([[-5.0, 0.5, 7.0]])
    assert stability_clip(g, None) is g
    np.testing.assert_array_equal(stability_clip(g, 1.0), [[-1.0, 0.5, 1.0]])


def test_direction_chunks_rows_and_threads():
    """z is the same whatever the thread count; direction_rows draws exactly z[rows]; chunks are independent."""
    lm = load_model("tiny-llama", track="ft")
    params = trainable_parameters(lm.model, "ft")
    pert = Perturber(lm.model, params, public_seed=11)
    i = max(range(len(params)), key=lambda j: params[j][1].numel())  # the embedding: many chunks
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        z1 = pert.direction(5, 0, i).clone()
        torch.set_num_threads(2)
        z2 = pert.direction(5, 0, i).clone()
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(z1, z2)
    lay = pert._layouts[i]
    assert lay.n_chunks > 4
    rows = torch.tensor([0, 3, lay.per_chunk, lay.per_chunk + 1, 3, z1.shape[0] - 1])
    from paczero.zo import directions
    many = torch.randint(0, z1.shape[0], (5000,), generator=torch.Generator().manual_seed(0))
    assert lay.n_chunks * lay.per_chunk * lay.row > 2 * directions._ROWS_GROUP_VALUES  # several groups of chunks
    for grouped in (None, False, True):  # CPU's default (all at once), and the accelerators' groups
        assert torch.equal(pert.direction_rows(5, 0, i, rows, grouped=grouped), z1[rows])
        assert torch.equal(pert.direction_rows(5, 0, i, many, grouped=grouped), z1[many])
    assert pert.direction_rows(5, 0, i, many[:0], grouped=True).shape == (0, *z1.shape[1:])
    a, b = lay.chunk_rows(0), lay.chunk_rows(1)
    c0, c1 = z1[a[0]:a[1]].flatten(), z1[b[0]:b[1]].flatten()
    assert not torch.equal(c0, c1)
    assert abs(float(torch.corrcoef(torch.stack([c0, c1]))[0, 1])) < 0.05
    assert abs(float(z1.mean())) < 0.01 and abs(float(z1.std()) - 1.0) < 0.01
    assert not torch.equal(z1, pert.direction(5, 1, i)) and not torch.equal(z1, pert.direction(6, 0, i))
    pert.remove()


def _scalars(lm, params, batches, task, **kw):
    from paczero.zo import two_point_scalars
    pert = Perturber(lm.model, params, public_seed=4, **kw)
    g, loss = two_point_scalars(pert, 1, 1, 1e-2, batches, lambda b: task.losses(lm.model, b), 10, "cpu")
    pert.remove()
    return g, loss


def _squad_like(n=10):
    words = ["river", "seven", "blue", "Paris", "winter", "gold", "north", "piano", "three", "salt"]
    return [{"id": str(j), "title": w, "context": f"The answer is {w}. " * (1 + j % 3),
             "question": f"What is item {j}?", "answers": [w]} for j, w in enumerate(words[:n])]


@pytest.mark.parametrize("name,task_name,dtype", [
    *[(n, t, "fp32") for n in ("tiny-opt", "tiny-llama", "tiny-gpt2") for t in ("demo", "squad")],
    ("tiny-opt", "demo", "bf16"), ("tiny-opt", "demo", "fp16")])
def test_lockstep_and_sequential_match_cached_bit_for_bit(name, task_name, dtype):
    """Lock-step waves (1 or 3 micro-batches at both signs, one draw of z per module, both signs from one
    premultiplied z) and one forward at a time give exactly the cached block's scalars and loss: also when
    every tensor counts as big (row-drawn embeddings, Linear layers evaluated in blocks of output rows),
    and in bf16/fp16."""
    from paczero.tasks import build_task, load_splits
    lm = load_model(name, track="ft", dtype=dtype)
    task = build_task(task_name, lm.tokenizer)
    train = _squad_like() if task_name == "squad" else load_splits(task_name, n_train=10, n_dev=1, n_test=1)[0]
    batches = task.make_batches(task.encode(train), token_budget=96)
    assert len(batches) >= 3
    params = trainable_parameters(lm.model, "ft")
    ref, ref_loss = _scalars(lm, params, batches, task, cache_limit=1 << 30)
    assert np.all(ref != 0) if dtype == "fp32" else np.any(ref != 0)
    with pytest.MonkeyPatch.context() as mp:  # cached with a whole perturbed copy of the embedding swapped in
        mp.setattr(zo.perturb, "_ROWS_MIN_VALUES", 1 << 62)
        g, loss = _scalars(lm, params, batches, task, cache_limit=1 << 30)
    assert np.array_equal(g, ref) and loss == ref_loss
    for big in (1 << 22, 1000):
        for lockstep in (0, 1, 3):
            g, loss = _scalars(lm, params, batches, task, cache_limit=0, big_values=big, lockstep=lockstep)
            assert np.array_equal(g, ref) and loss == ref_loss, (big, lockstep)
    # waves by tokens (the training loop's form): micro-batches grouped up to 1 or 2 budgets per sign
    for lockstep in (1, 2):
        g, loss = _scalars(lm, params, batches, task, cache_limit=0, lockstep=lockstep, token_budget=96)
        assert np.array_equal(g, ref) and loss == ref_loss, lockstep


def _count_draws(monkeypatch) -> list:
    """Record the number of z values drawn by each fill (the cost lock-step saves)."""
    drawn = []
    fill = Perturber._fill

    def counting(self, key, out, first, last, *a, **kw):
        drawn.append(out.numel())
        return fill(self, key, out, first, last, *a, **kw)

    monkeypatch.setattr(Perturber, "_fill", counting)
    return drawn


def test_lockstep_draws_each_direction_once_per_wave(monkeypatch):
    from paczero.tasks import build_task, load_splits
    from paczero.zo import two_point_scalars
    lm = load_model("tiny-llama", track="ft")
    task = build_task("demo", lm.tokenizer)
    train, _, _ = load_splits("demo", n_train=12, n_dev=1, n_test=1)
    batches = task.make_batches(task.encode(train), token_budget=64)
    n_b = len(batches)
    assert n_b >= 4
    params = trainable_parameters(lm.model, "ft")
    drawn = _count_draws(monkeypatch)
    totals = {}
    for lockstep in (0, 1, n_b):
        drawn.clear()
        pert = Perturber(lm.model, params, public_seed=4, cache_limit=0, lockstep=lockstep)
        two_point_scalars(pert, 1, 1, 1e-2, batches, lambda b: task.losses(lm.model, b), 12, "cpu")
        totals[lockstep] = sum(drawn)
    # 2 forwards per micro-batch draw z each; a wave of L micro-batches draws it once for its 2L forwards
    assert totals[0] == 2 * n_b * totals[n_b]
    assert totals[1] == n_b * totals[n_b]


def test_token_waves_group_small_micro_batches_and_never_exceed_the_budget(monkeypatch):
    """With a token budget, a wave is as many consecutive micro-batches as fit in lockstep x budget padded
    tokens (at least one): fewer draws than one wave per micro-batch, never more tokens in flight."""
    from types import SimpleNamespace

    from paczero.tasks import build_task, load_splits
    from paczero.zo import lockstep_waves, two_point_scalars
    fake = [SimpleNamespace(num_tokens=t) for t in (30, 30, 50, 100, 20, 20, 20)]
    pert = SimpleNamespace(lockstep=1, wave_tokens=100)
    assert lockstep_waves(fake, pert) == [(0, 2), (2, 3), (3, 4), (4, 7)]
    pert.wave_tokens = 200
    assert lockstep_waves(fake, pert) == [(0, 3), (3, 7)]
    pert.wave_tokens = 10  # a micro-batch above the budget still forms its own wave
    assert lockstep_waves(fake, pert) == [(j, j + 1) for j in range(7)]
    pert.wave_tokens, pert.lockstep = None, 3
    assert lockstep_waves(fake, pert) == [(0, 3), (3, 6), (6, 7)]

    lm = load_model("tiny-llama", track="ft")
    task = build_task("demo", lm.tokenizer)
    train, _, _ = load_splits("demo", n_train=12, n_dev=1, n_test=1)
    batches = task.make_batches(task.encode(train), token_budget=64)
    params = trainable_parameters(lm.model, "ft")
    real = Perturber(lm.model, params, public_seed=4, cache_limit=0, lockstep=1, token_budget=10_000)
    assert lockstep_waves(batches, real) == [(0, len(batches))]  # the whole step fits: one wave
    drawn = _count_draws(monkeypatch)
    counts = {}
    for budget in (None, 10_000):
        drawn.clear()
        pert = Perturber(lm.model, params, public_seed=4, cache_limit=0, lockstep=1, token_budget=budget)
        two_point_scalars(pert, 1, 1, 1e-2, batches, lambda b: task.losses(lm.model, b), 12, "cpu")
        counts[budget] = sum(drawn)
    assert counts[None] == len(batches) * counts[10_000]


class _Nested(torch.nn.Module):
    """Owner modules inside owner modules, a row-mixing owner, and routing that depends on the data."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.scale = torch.nn.Parameter(torch.rand(4, generator=g) + 0.5)
        self.inner = torch.nn.Linear(4, 4)
        self.odd = torch.nn.Linear(4, 4, bias=False)
        self.even = torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):  # owns `scale` and calls its children: a generic owner around owners
        h = self.inner(x * self.scale)
        h = h - h.mean(0, keepdim=True) * self.scale  # mixes rows
        return self.odd(h) if int(x[0, 0] > 0) else self.even(h)


class _Top(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Nested()
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.block(x)))[:, 0]


def test_lockstep_nested_row_mixing_and_data_dependent_owners():
    """Jobs that meet at different modules are served group by group; nested owners evaluate at their
    caller's scale; every path gives the in-place reference exactly."""
    torch.manual_seed(0)
    model = _Top()
    params = list(model.named_parameters())
    xs = [torch.randn(3, 4) for _ in range(4)]
    xs[0][0, 0], xs[1][0, 0], xs[2][0, 0], xs[3][0, 0] = 1.0, -1.0, 1.0, -1.0  # two routes
    results = {}
    for label, kw in [("cached", dict(cache_limit=1 << 30)), ("lockstep", dict(cache_limit=0))]:
        pert = Perturber(model, params, public_seed=1, **kw)
        with torch.inference_mode():
            jobs = [(s, (lambda x=x: model(x))) for s in (1e-2, -1e-2) for x in xs]
            results[label] = pert.evaluate(3, 0, jobs)
        assert all("forward" not in m.__dict__ for m in model.modules())
    ref = Perturber(model, params, public_seed=1, cache_limit=1 << 30)
    before = [p.detach().clone() for _, p in params]
    for j, s in enumerate([1e-2] * 4 + [-1e-2] * 4):
        with torch.no_grad():
            for i, (_, p) in enumerate(params):
                p.copy_(before[i] + ref.direction(3, 0, i) * s)
            expected = model(xs[j % 4])
            for i, (_, p) in enumerate(params):
                p.copy_(before[i])
        assert torch.equal(results["cached"][j], expected)
        assert torch.equal(results["lockstep"][j], expected)


def test_lockstep_error_in_one_job_propagates_and_cleans_up():
    model = _Top()
    params = list(model.named_parameters())
    pert = Perturber(model, params, public_seed=1, cache_limit=0)

    def bad():
        model(torch.randn(2, 4))
        raise ValueError("boom")

    with torch.inference_mode():
        with pytest.raises(ValueError, match="boom"):
            pert.evaluate(0, 0, [(1e-3, lambda: model(torch.randn(2, 4))), (-1e-3, bad),
                                 (-1e-3, lambda: model(torch.randn(2, 4)))])
        assert all("forward" not in m.__dict__ for m in model.modules()) and not pert._members
        out = pert.evaluate(0, 0, [(1e-3, lambda: model(torch.ones(2, 4))), (-1e-3, lambda: model(torch.ones(2, 4)))])
    assert out[0].shape == (2,) and not torch.equal(out[0], out[1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_lockstep_restoration_is_bit_exact(dtype):
    from paczero.tasks import build_task, load_splits
    from paczero.zo import two_point_scalars
    lm = load_model("tiny-llama", track="ft", dtype=dtype)
    task = build_task("demo", lm.tokenizer)
    train, _, _ = load_splits("demo", n_train=6, n_dev=1, n_test=1)
    batches = task.make_batches(task.encode(train), token_budget=64)
    params = trainable_parameters(lm.model, "ft")
    before = [p.detach().clone() for _, p in params]
    pert = Perturber(lm.model, params, public_seed=2, cache_limit=0, big_values=1000, lockstep=2)
    for step in range(5):
        two_point_scalars(pert, step, 1, 1e-3, batches, lambda b: task.losses(lm.model, b), 6, "cpu")
        pert.apply_update(step, [1.0], lr=0.0)
    assert all(torch.equal(p.detach(), b) for (_, p), b in zip(params, before))
    assert all("forward" not in m.__dict__ for m in lm.model.modules())  # overrides removed
    pert.remove()


def test_cached_block_swaps_in_the_one_arithmetic_for_small_tensors_together():
    """Inside a cached block every trained tensor (LoRA's small fp32 ones, formed together in multi-tensor
    operations) holds fl(fl(z * s) + theta), recomputed here with torch's operators from direction(); after the
    block the originals, bit for bit. Red if the grouped path rounds once (a fused multiply-add such as
    ``torch._foreach_addcmul``), takes another direction's z or scale, or leaves a perturbed tensor in place."""
    lm = load_model("tiny-llama", track="lora")
    params = trainable_parameters(lm.model, "lora")
    start = [p.detach().clone() for _, p in params]
    pert = Perturber(lm.model, params, public_seed=4)
    assert pert.cache and len(params) >= 2
    for k, s in ((0, 1e-3), (1, -1e-3), (0, 0.37)):
        with pert.perturbed(2, k, s):
            for i, (name, p) in enumerate(params):
                assert torch.equal(p.data, pert.direction(2, k, i) * s + start[i]), name
        assert all(torch.equal(p.data, s0) for (_, p), s0 in zip(params, start))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_perturbation_arithmetic_is_two_fp32_roundings_then_one_to_the_weights_dtype(dtype):
    """fl(fl(z * s) + theta) in fp32, rounded once to theta's dtype, on the whole-tensor and scratch paths."""
    from paczero.zo import _perturb
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(4099, generator=gen)
    base = torch.randn(4099, generator=gen).to(dtype)
    s = 1e-3
    want = ((z * s) + base.float()).to(dtype)
    assert torch.equal(_perturb(z, s, base), want)
    lm = load_model("tiny-llama", track="ft")
    pert = Perturber(lm.model, trainable_parameters(lm.model, "ft"), public_seed=1, cache_limit=0)
    assert torch.equal(pert._combine(z, s, base, "t"), want) and torch.equal(pert._combine(z, -s, base, "t"),
                                                                            ((z * -s) + base.float()).to(dtype))


def test_cached_block_perturbs_a_trained_embedding_by_looked_up_rows(monkeypatch, ids):
    """A cached block (full fine-tuning of a small model) never forms a whole perturbed copy of the trained
    embedding: its forward perturbs the looked-up rows from the cached z, with the same arithmetic."""
    lm = load_model("tiny-opt", track="ft")
    pert = Perturber(lm.model, trainable_parameters(lm.model, "ft"), public_seed=5)
    emb = lm.model.get_input_embeddings()
    assert pert.cache and id(emb.weight) in pert._rows_params
    sizes = []
    perturb = zo.layers._perturb  # the one perturbation arithmetic, looked up in paczero/zo/layers.py
    monkeypatch.setattr(zo.layers, "_perturb",
                        lambda z, s, base, **kw: sizes.append(base.numel()) or perturb(z, s, base, **kw))
    weight, ptr = emb.weight.data, emb.weight.data_ptr()
    with torch.inference_mode():
        z = pert.direction(0, 0, pert._index[id(emb.weight)])
        with pert.perturbed(0, 0, 1e-2):
            assert emb.weight.data_ptr() == ptr  # nothing swapped in
            out = emb(ids)
        assert "forward" not in emb.__dict__  # the plain forward again after the block
        want = perturb(z, 1e-2, weight)[ids]
    assert torch.equal(out, want)
    assert sizes and max(sizes) < weight.numel() // 10  # only the looked-up rows were perturbed
    monkeypatch.setattr(zo.perturb, "_ROWS_MIN_VALUES", 1 << 62)  # control: the whole-copy swap is seen by the checks
    whole = Perturber(lm.model, trainable_parameters(lm.model, "ft"), public_seed=5)
    sizes.clear()
    with torch.inference_mode(), whole.perturbed(0, 0, 1e-2):
        assert emb.weight.data_ptr() != ptr and torch.equal(emb(ids), want)
    assert sum(sizes) >= weight.numel()  # the whole copy, formed a block of values at a time
