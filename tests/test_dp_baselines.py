"""DPZero / DP-AggZO: accounting against dp-accounting, Poisson sampling, clipping, private noise, state."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from paczero.mechanisms.dp import DPAggZO, DPZero, DPZeroAggZO1, clip_rows, clip_scalars
from paczero.privacy import dp as dpp

DELTA = 1e-5


def _reference_epsilon(sigma, q, steps, delta, accountant, laplace_scale=None, pld_discretization=1e-4):
    """Epsilon straight from dp-accounting, without going through paczero."""
    event = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps
    )
    if laplace_scale is not None:  # the count's discrete Laplace: a = 1/b, exact (PLD) or a^2/2-zCDP (RDP)
        a = math.nextafter(1.0 / laplace_scale, math.inf)
        count = dp_event.DiscreteLaplaceDpEvent(a, 1) if accountant == "pld" else dp_event.ZCDpEvent(a * a / 2)
        event = dp_event.ComposedDpEvent([count, event])
    if accountant == "rdp":
        acc = rdp_privacy_accountant.RdpAccountant()
    else:
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=pld_discretization)
    return acc.compose(event).get_epsilon(delta)


# ------------------------------------------------------------------ accounting


@pytest.mark.parametrize("q, steps, epsilon", [(0.064, 100, 1.0), (0.064, 1000, 0.5), (0.01, 500, 2.0)])
def test_rdp_calibration_round_trip(q, steps, epsilon):
    sigma = dpp.calibrate_noise_multiplier(epsilon, DELTA, q, steps, "rdp")
    achieved = _reference_epsilon(sigma, q, steps, DELTA, "rdp")
    assert achieved <= epsilon
    assert achieved >= 0.99 * epsilon
    assert dpp.dpzero_epsilon(sigma, q, steps, DELTA, "rdp") == pytest.approx(achieved, rel=1e-12)


def test_pld_calibration_round_trip():
    q, steps, epsilon = 0.064, 200, 1.0
    sigma = dpp.calibrate_noise_multiplier(epsilon, DELTA, q, steps, "pld", pld_discretization=1e-3)
    achieved = _reference_epsilon(sigma, q, steps, DELTA, "pld", pld_discretization=1e-3)
    assert 0.99 * epsilon <= achieved <= epsilon


@pytest.mark.parametrize("sigma, q, steps", [(2.0, 0.064, 100), (5.0, 0.064, 1000), (1.0, 0.01, 300)])
def test_pld_no_looser_than_rdp(sigma, q, steps):
    eps_rdp = dpp.dpzero_epsilon(sigma, q, steps, DELTA, "rdp")
    eps_pld = dpp.dpzero_epsilon(sigma, q, steps, DELTA, "pld", pld_discretization=1e-3)
    assert 0 < eps_pld <= eps_rdp * 1.01


def test_zero_steps_cost_nothing():
    assert dpp.dpzero_epsilon(3.0, 0.1, 0, DELTA) == 0.0


def test_dp_aggzo_split_and_composition():
    q, steps, epsilon = 0.064, 300, 1.0
    cal = dpp.calibrate_dp_aggzo(epsilon, DELTA, q, steps)
    assert cal.noise_multiplier == dpp.calibrate_noise_multiplier(0.95 * epsilon, DELTA, q, steps)
    assert cal.laplace_scale == pytest.approx(1 / (0.05 * epsilon))
    assert cal.epsilon_gaussian + cal.epsilon_laplace == pytest.approx(epsilon)
    for accountant in dpp.ACCOUNTANTS:
        composed = dpp.dp_aggzo_epsilon(cal.noise_multiplier, cal.laplace_scale, q, steps, DELTA, accountant)
        reference = _reference_epsilon(cal.noise_multiplier, q, steps, DELTA, accountant, cal.laplace_scale)
        assert composed == pytest.approx(reference, rel=1e-12)
        gaussian_only = dpp.dpzero_epsilon(cal.noise_multiplier, q, steps, DELTA, accountant)
        assert gaussian_only < composed
    # calibrated under RDP, composed under RDP: within the basic-composition budget
    assert dpp.dp_aggzo_epsilon(cal.noise_multiplier, cal.laplace_scale, q, steps, DELTA, "rdp") <= epsilon


BAD_ARGUMENTS = [
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": -1.0}, "epsilon"),
    ({"epsilon": math.nan}, "epsilon"),
    ({"epsilon": math.inf}, "epsilon"),
    ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"),
    ({"delta": math.nan}, "delta"),
    ({"sample_rate": 0.0}, "sample_rate"),
    ({"sample_rate": 1.5}, "sample_rate"),
    ({"sample_rate": math.inf}, "sample_rate"),
    ({"steps": 0}, "steps"),
    ({"steps": 2.5}, "steps"),
    ({"accountant": "moments"}, "accountant"),
]


@pytest.mark.parametrize("override, name", BAD_ARGUMENTS)
def test_calibration_rejects_bad_inputs(override, name):
    kwargs = {"epsilon": 1.0, "delta": DELTA, "sample_rate": 0.064, "steps": 100, "accountant": "rdp"}
    kwargs.update(override)
    with pytest.raises(ValueError, match=name):
        dpp.calibrate_noise_multiplier(**kwargs)
    with pytest.raises(ValueError, match=name):
        dpp.calibrate_dp_aggzo(**kwargs)


MECHANISM_BAD_ARGUMENTS = BAD_ARGUMENTS + [({"clip": 0.0}, "clip"), ({"num_examples": 0}, "num_examples")]


@pytest.mark.parametrize("override, name", MECHANISM_BAD_ARGUMENTS)
def test_mechanisms_reject_bad_inputs(override, name):
    kwargs = {"num_examples": 100, "epsilon": 1.0, "delta": DELTA, "steps": 100, "sample_rate": 0.064,
              "clip": 25.0, "accountant": "rdp"}
    kwargs.update(override)
    with pytest.raises(ValueError, match=name):
        DPZero(**kwargs)
    with pytest.raises(ValueError, match=name):
        DPAggZO(num_directions=4, **kwargs)


def test_epsilon_rejects_bad_noise():
    with pytest.raises(ValueError, match="noise_multiplier"):
        dpp.dpzero_epsilon(0.0, 0.1, 10, DELTA)
    with pytest.raises(ValueError, match="laplace_scale"):
        dpp.dp_aggzo_epsilon(1.0, -1.0, 0.1, 10, DELTA)


# ------------------------------------------------------------------ Poisson sampling


def test_poisson_batch_sizes_mean_and_variance():
    n, q, draws = 1000, 0.064, 2000
    mech = DPZero(n, 2.0, DELTA, draws, q, 25.0, seed=7)
    sizes = np.empty(draws)
    hits = np.zeros(n)
    for t in range(draws):
        idx = mech.batch_indices(n)
        assert idx.dtype == np.int64
        assert np.all(np.diff(idx) > 0) and (idx.size == 0 or (idx[0] >= 0 and idx[-1] < n))
        sizes[t] = idx.size
        hits[idx] += 1
        mech.step(np.zeros((1, idx.size)))
    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean() - mean) < 4 * math.sqrt(var / draws)
    # standard error of a sample variance (binomial kurtosis is close to normal here)
    assert abs(sizes.var(ddof=1) - var) < 4 * var * math.sqrt(2 / (draws - 1))
    # every example is sampled independently at rate q: no fixed shuffled batches
    assert abs(hits.mean() / draws - q) < 0.002
    assert hits.min() > 0


def test_empty_batch_releases_pure_noise():
    mech = DPZero(3, 1.0, DELTA, 50, 0.01, 25.0, seed=3)
    empties = 0
    for _ in range(50):
        idx = mech.batch_indices(3)
        release = mech.step(np.zeros((1, idx.size)))[0]
        empties += idx.size == 0
        assert math.isfinite(release.coef) and release.branch == "dp"
    assert empties > 0


def test_steps_must_pair_with_batches():
    mech = DPZero(100, 1.0, DELTA, 2, 0.5, 25.0, seed=0)
    with pytest.raises(RuntimeError):
        mech.step(np.zeros((1, 0)))
    with pytest.raises(ValueError, match="num_examples"):
        mech.batch_indices(99)
    idx = mech.batch_indices(100)
    with pytest.raises(RuntimeError):
        mech.batch_indices(100)
    with pytest.raises(ValueError, match="shape"):
        mech.step(np.zeros((1, idx.size + 1)))
    with pytest.raises(ValueError, match="NaN"):
        mech.step(np.full((1, idx.size), np.nan))
    mech.step(np.zeros((1, idx.size)))
    mech.step(np.zeros((1, mech.batch_indices(100).size)))
    with pytest.raises(RuntimeError, match="spent"):
        mech.batch_indices(100)


# ------------------------------------------------------------------ private noise


def _run(mech, steps, k, value=1.0):
    out = []
    for _ in range(steps):
        idx = mech.batch_indices(mech.num_examples)
        releases = mech.step(np.full((k, idx.size), value))
        out.append((idx.tolist(), [r.coef for r in releases]))
    return out


@pytest.mark.parametrize("make, k", [
    (lambda seed: DPZero(200, 1.0, DELTA, 100, 0.064, 25.0, seed=seed), 1),
    (lambda seed: DPAggZO(200, 1.0, DELTA, 100, 0.064, 25.0, 4, seed=seed), 4),
])
def test_noise_comes_from_the_private_generator(make, k):
    assert _run(make(11), 5, k) == _run(make(11), 5, k)
    assert _run(make(11), 5, k) != _run(make(12), 5, k)
    # public seeding (global numpy state) does not determine the private noise
    np.random.seed(0)
    first = _run(make(None), 5, k)
    np.random.seed(0)
    second = _run(make(None), 5, k)
    assert first != second


# ------------------------------------------------------------------ clipping and scaling


def test_clip_functions():
    scalars = np.array([30.0, -40.0, 3.0, -2.5])
    np.testing.assert_allclose(clip_scalars(scalars, 25.0), [25.0, -25.0, 3.0, -2.5])
    rows = np.array([[30.0, 40.0], [3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(clip_rows(rows, 25.0), [[15.0, 20.0], [3.0, 4.0], [0.0, 0.0]])


def test_dpzero_clips_sums_and_normalises():
    n, q, clip = 500, 0.1, 25.0
    signal = DPZero(n, 1.0, DELTA, 10, q, clip, seed=5)
    noise_only = DPZero(n, 1.0, DELTA, 10, q, clip, seed=5)
    b = signal.batch_indices(n).size
    assert noise_only.batch_indices(n).size == b
    scalars = np.resize([100.0, -30.0, 3.0, -2.5], b)[None, :]
    delta_coef = signal.step(scalars)[0].coef - noise_only.step(np.zeros((1, b)))[0].coef
    assert delta_coef == pytest.approx(np.clip(scalars, -clip, clip).sum() / (q * n))
    release = signal.step(np.zeros((1, signal.batch_indices(n).size)))[0]
    assert release.sigma == pytest.approx(signal.noise_multiplier * clip / (q * n))
    assert (release.bit, release.branch, release.mi) == (0, "dp", 0.0)
    assert signal.mi_spent == 0.0 and signal.steps == 2


def test_dpzero_release_does_not_depend_on_the_private_size():
    """Add-or-remove-one adjacency: a neighbouring universe has another N, so with a public normaliser
    (``public_size``, the configured n_train) the release of the same batch and noise is the same for
    N = 500 and N = 501. Control: normalised by the true N (no public_size) the releases differ.
    Red if the denominator reads num_examples while public_size is set."""
    def release(n, **kw):
        mech = DPZero(n, 1.0, DELTA, 10, 0.1, 25.0, seed=3, **kw)
        mech._rng.random(n)  # the draw batch_indices makes (its length is N's: the mask itself is private)
        mech._pending = 4
        return mech.step(np.array([[1.0, -2.0, 3.0, 0.5]]))[0]

    assert release(500, public_size=500) == release(501, public_size=500)
    assert release(500).coef != release(501).coef
    assert DPZero(10, 1.0, DELTA, 10, 0.1, 25.0, seed=3).privacy_statement()["adjacency"] == "add-or-remove-one"
    with pytest.raises(ValueError, match="public_size"):
        DPZero(10, 1.0, DELTA, 10, 0.1, 25.0, public_size=0)


def test_dp_aggzo_clips_rows_and_scales_by_k():
    n, q, clip, k, lr = 500, 0.1, 25.0, 2, 5e-6
    signal = DPAggZO(n, 1.0, DELTA, 10, q, clip, k, seed=9)
    noise_only = DPAggZO(n, 1.0, DELTA, 10, q, clip, k, seed=9)
    assert signal.noisy_num_examples == noise_only.noisy_num_examples != n
    denominator = q * signal.noisy_num_examples
    b = signal.batch_indices(n).size
    noise_only.batch_indices(n)
    # per-example K-vectors: divided by K -> (30, 40) clipped to (15, 20), (3, 4) unchanged
    per_example = np.resize(np.array([[60.0, 80.0], [6.0, 8.0]]), (b, k))
    coefs = np.array([r.coef for r in signal.step(per_example.T)])
    noise = np.array([r.coef for r in noise_only.step(np.zeros((k, b)))])
    g = clip_rows(per_example / k, clip).sum(axis=0) / denominator
    np.testing.assert_allclose(coefs - noise, k * g)
    # engine update (lr / K) sum_k coef_k z_k equals DP-AggZO's lr sum_k g~_k z_k
    z = np.random.default_rng(0).standard_normal((k, 7))
    g_tilde = coefs / k
    np.testing.assert_allclose((lr / k) * coefs @ z, lr * g_tilde @ z)


# ------------------------------------------------------------------ state and statement


@pytest.mark.parametrize("make, k", [
    (lambda seed: DPZero(300, 1.0, DELTA, 20, 0.064, 25.0, seed=seed), 1),
    (lambda seed: DPAggZO(300, 1.0, DELTA, 20, 0.064, 25.0, 3, seed=seed), 3),
    (lambda seed: DPZeroAggZO1(300, 1.0, DELTA, 20, 0.064, 25.0, seed=seed), 1),
])
def test_state_dict_round_trip(make, k):
    original = make(21)
    _run(original, 4, k)
    state = copy.deepcopy(original.state_dict())
    expected = _run(original, 6, k)
    resumed = make(99)
    resumed.load_state_dict(state)
    assert resumed.steps == 4
    assert _run(resumed, 6, k) == expected


def test_load_state_dict_refuses_mismatches():
    dpzero = DPZero(300, 1.0, DELTA, 20, 0.064, 25.0, seed=1)
    aggzo = DPAggZO(300, 1.0, DELTA, 20, 0.064, 25.0, 3, seed=1)
    with pytest.raises(ValueError, match="mechanism"):
        aggzo.load_state_dict(dpzero.state_dict())
    for key, value in [("epsilon", 2.0), ("delta", 1e-6), ("total_steps", 21), ("sample_rate", 0.1),
                       ("clip", 10.0), ("num_directions", 4)]:
        with pytest.raises(ValueError, match=key):
            aggzo.load_state_dict({**aggzo.state_dict(), key: value})
    with pytest.raises(ValueError, match="epsilon"):
        dpzero.load_state_dict({**DPZero(300, 2.0, DELTA, 20, 0.064, 25.0, seed=1).state_dict()})


@pytest.mark.parametrize("make", [
    lambda: DPZero(300, 1.0, DELTA, 20, 0.064, 25.0, seed=2),
    lambda: DPAggZO(300, 1.0, DELTA, 20, 0.064, 25.0, 3, seed=2),
    lambda: DPZeroAggZO1(300, 1.0, DELTA, 20, 0.064, 25.0, seed=2),
])
def test_privacy_statement(make):
    mech = make()
    _run(mech, 5, mech.num_directions)
    statement = mech.privacy_statement()
    assert statement["mechanism"] == mech.name and statement["private"] is True
    assert statement["steps"] == 5 and statement["planned_steps"] == 20
    assert statement["epsilon_target"] == 1.0 and statement["delta"] == DELTA
    assert 0 < statement["epsilon_rdp"] < statement["epsilon_rdp_planned"] <= 1.0
    assert 0 < statement["epsilon_pld"] < statement["epsilon_pld_planned"] <= 1.0
    assert statement["epsilon_pld_planned"] <= statement["epsilon_rdp_planned"] * 1.01
    assert statement["noise_multiplier"] == mech.noise_multiplier
    assert statement["mia_bound"] == pytest.approx(math.e / (1 + math.e) + DELTA)


def test_calibration_does_not_flood_the_console_with_dropped_renyi_orders(caplog):
    """At q = 0.25 dp-accounting warns once per Renyi order it leaves out (about 70 lines per run);
    paczero drops only that message. The epsilon is unchanged by it."""
    import logging

    from absl import logging as absl_logging

    dpp._calibrate.cache_clear()
    with caplog.at_level(logging.WARNING, logger="absl"):
        sigma = dpp.calibrate_noise_multiplier(2.0, 1e-5, 0.25, 10)
        absl_logging.warning("another dp-accounting warning")
    messages = [r.getMessage() for r in caplog.records]
    assert not any("_compute_log_a_frac" in m for m in messages) and "another dp-accounting warning" in messages
    assert dpp.dpzero_epsilon(sigma, 0.25, 10, 1e-5) <= 2.0


# ------------------------------------------------------------------ DPZero through the DP-AggZO code (K = 1)


@pytest.mark.parametrize("epsilon", [0.2, 2.0])
def test_dpzero_aggzo1_accounting_is_the_split_computed_independently(epsilon):
    """dpzero-aggzo1 (the paper's dp-cliff DPZero cells): the Gaussian steps get 0.95 epsilon, the Laplace count
    1 / b = 0.05 epsilon. Checked against dp-accounting called here directly: the noise multiplier is the one
    calibrate_dp_mechanism gives for 0.95 epsilon, the Laplace part is exactly 0.05 epsilon-DP, the two add up to
    at most epsilon (basic composition), and the reported epsilons are the composed event's. Red if the Gaussian
    part is calibrated to the whole epsilon (DPZero's budget), if b is 1 / epsilon, or if the statement leaves the
    Laplace release out of the composition."""
    from dp_accounting import mechanism_calibration

    q, steps, n = 0.064, 200, 400
    mech = DPZeroAggZO1(n, epsilon, DELTA, steps, q, 25.0, seed=4)
    sigma = mechanism_calibration.calibrate_dp_mechanism(
        rdp_privacy_accountant.RdpAccountant,
        lambda s: dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), steps),
        0.95 * epsilon, DELTA)
    assert mech.noise_multiplier == pytest.approx(sigma, rel=1e-9)
    assert mech.laplace_scale == pytest.approx(1.0 / (0.05 * epsilon), rel=1e-12)
    gaussian = _reference_epsilon(mech.noise_multiplier, q, steps, DELTA, "rdp")
    laplace = 1.0 / mech.laplace_scale  # pure DP of a sensitivity-1 count under Lap(b)
    assert gaussian <= 0.95 * epsilon + 1e-12 and gaussian + laplace <= epsilon + 1e-12
    statement = mech.privacy_statement()
    composed = _reference_epsilon(mech.noise_multiplier, q, steps, DELTA, "rdp", mech.laplace_scale)
    assert statement["epsilon_rdp_planned"] == pytest.approx(composed, rel=1e-12)
    assert gaussian < statement["epsilon_rdp_planned"] <= epsilon
    assert statement["mechanism"] == "dpzero-aggzo1" and statement["num_directions"] == 1
    assert statement["epsilon_split"] == pytest.approx({"gaussian": 0.95 * epsilon, "laplace": 0.05 * epsilon})
    # DPZero as its own paper specifies it spends all of epsilon on the steps: less noise than this one
    assert DPZero(n, epsilon, DELTA, steps, q, 25.0, seed=4).noise_multiplier < mech.noise_multiplier


def test_dpzero_aggzo1_releases_what_dp_aggzo_releases_at_k_1():
    """Same private generator, same batch, same scalars: the release equals DP-AggZO's at K = 1 (clip to [-C, C],
    noisy sum over q * (N + Lap(b))), and differs from DPZero's public normaliser. Red if the K = 1 variant
    normalised by q * n_train or clipped otherwise."""
    n, q, clip = 300, 0.2, 25.0
    ours, theirs = DPZeroAggZO1(n, 1.0, DELTA, 10, q, clip, seed=9), DPAggZO(n, 1.0, DELTA, 10, q, clip, 1, seed=9)
    b = ours.batch_indices(n).size
    assert theirs.batch_indices(n).size == b
    scalars = np.resize([100.0, -30.0, 3.0], b)[None, :]
    a, r = ours.step(scalars)[0], theirs.step(scalars)[0]
    assert (a.coef, a.sigma) == (r.coef, r.sigma)
    quiet = DPZeroAggZO1(n, 1.0, DELTA, 10, q, clip, seed=9)
    quiet.noise_multiplier = 1e-300  # no noise: the clipped sum over the noisy expected batch size remains
    quiet.batch_indices(n)
    expected = np.clip(scalars, -clip, clip).sum() / (q * quiet.noisy_num_examples)
    assert quiet.step(scalars)[0].coef == pytest.approx(expected, rel=1e-12)
    assert quiet.noisy_num_examples != n
    with pytest.raises(ValueError, match="one direction"):
        DPZeroAggZO1(n, 1.0, DELTA, 10, q, clip, 2)
    with pytest.raises(ValueError, match="mechanism"):
        ours.load_state_dict(theirs.state_dict())
