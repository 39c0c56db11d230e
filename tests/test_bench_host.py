"""``paczero bench --host``: each method's step split into the model's time and the host time around it
(paczero/bench/host.py), on the tiny models built from their configs."""
import time

import pytest
import torch

from paczero.bench import BenchConfig, Harness, measure
from paczero.bench import host as host_mod
from paczero.bench.host import HOST_METHODS, ModelClock, host_table, measure_host


@pytest.fixture(scope="module")
def harness():
    return Harness(BenchConfig(model="tiny-llama", track="lora", n=16, threads=1))


def test_interleaved_forwards_count_once():
    """Two forwards open at once (lock-step jobs) count the span from the first entry to the last exit, once;
    time between forwards is not counted. Red if the clock adds each call's own interval (no merging: about
    0.06 s here instead of 0.04) or keeps running between forwards."""
    clock = ModelClock()
    clock.enter()
    time.sleep(0.02)
    clock.enter()  # a second job's forward starts while the first is parked
    time.sleep(0.02)
    clock.leave()
    clock.leave()
    outer = clock.wall
    time.sleep(0.05)  # between forwards: host time
    assert clock.wall == outer
    assert 0.04 <= outer < 0.06


def test_backwards_are_model_time_only_inside_the_block():
    """``Tensor.backward`` is timed while :meth:`ModelClock.backwards` is open and restored after. Red if the
    patch leaks out of the block or a backward inside it is not counted."""
    original = torch.Tensor.backward
    x = torch.ones(3, requires_grad=True)

    def slow(grad):
        time.sleep(0.03)
        return grad

    x.register_hook(slow)
    clock = ModelClock()
    with clock.backwards():
        (x * 2).sum().backward()
    assert clock.wall >= 0.03
    assert torch.Tensor.backward is original
    before = clock.wall
    (x * 2).sum().backward()
    assert clock.wall == before


def test_host_time_is_the_step_outside_the_models_forwards(harness, monkeypatch):
    """A delay put into the update (outside every forward) lands in ``host_s``, a delay put into every forward
    lands in ``model_s``, and step = model + host for every method. Red if host and model time are swapped, if
    host time is computed from another clock than the step's, or if a method's forwards are not timed."""
    outside, inside = 0.05, 0.01
    from paczero.zo.perturb import Perturber

    update = Perturber.apply_update

    def slow_update(self, *a, **kw):
        time.sleep(outside)
        return update(self, *a, **kw)

    monkeypatch.setattr(Perturber, "apply_update", slow_update)
    losses = harness.task.losses

    def slow_losses(model, batch):
        time.sleep(inside)
        return losses(model, batch)

    monkeypatch.setattr(harness.task, "losses", slow_losses)
    res = measure_host(harness, steps=1, log=lambda s: None)
    assert list(res) == list(HOST_METHODS)
    batches = len(harness.batches)
    for m, r in res.items():
        assert r["step_s"] == pytest.approx(r["model_s"] + r["host_s"], rel=1e-9)
        assert r["model_s"] >= (2 if m in ("pac-zpl", "mezo") else 1) * batches * inside, m
    for m in ("pac-zpl", "mezo"):
        assert res[m]["host_s"] >= outside
    assert all(not mod.training for mod in harness.model.modules())  # Opacus's training mode undone


def test_each_zeroth_order_step_draws_its_own_z(harness, monkeypatch):
    """PAC-ZPL and MeZO share the perturber, which keeps a step's z: every timed step must have a step number of
    its own, so that each draws z as a training step does. Red if the methods' steps share numbers (then the
    second method's steps draw nothing)."""
    from paczero.zo.perturb import Perturber

    draws = []
    draw = Perturber._draw_step
    monkeypatch.setattr(Perturber, "_draw_step", lambda self, step, k: (draws.append(step), draw(self, step, k))[1])
    measure_host(harness, steps=2, methods=("pac-zpl", "mezo"), log=lambda s: None)
    assert len(draws) == len(set(draws)) == 2 * 3  # two methods, a warm-up and two steps each


def test_bench_reports_host_rows(capsys):
    """``--host`` puts a ``host`` entry per method in the row and a table with one line per method; with
    ``--mechanism dp-sgd`` or ``--compile`` it is one error line, exit 2."""
    res = measure(BenchConfig(model="tiny-opt", track="lora", n=8, steps=1, scaling=False, memory=False,
                              plain=False, host=True, threads=1), log=lambda s: None)
    assert set(res["host"]) == set(HOST_METHODS)
    lines = host_table([res]).splitlines()
    assert len(lines) == 2 + len(HOST_METHODS) and "host ms" in lines[0]
    from paczero.cli import main

    for argv in (["--host", "--mechanism", "dp-sgd"], ["--host", "--compile"]):
        assert main(["bench", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--host" in err[0]


def test_the_module_reads_only_older_interfaces():
    """benchmarks/host_time.py runs this module against an older checkout: it may import only what the
    Harness, the zeroth-order step and the first-order steps already offered."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(host_mod))
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= {"__future__", "collections.abc", "contextlib", "dataclasses", "paczero.bench.harness",
                     "paczero.fo.adamw_step", "paczero.fo.dpsgd_step", "paczero.mechanisms.dpsgd",
                     "paczero.mechanisms.reference", "paczero.models", "paczero.run.build",
                     "paczero.run.distributed", "paczero.zo"}, names
