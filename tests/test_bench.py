"""The benchmark runs end to end on a tiny model; the cached, sequential and lock-step perturbation paths agree."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from paczero.bench import BenchConfig, measure, table
from paczero.models import load_model, trainable_parameters
from paczero.tasks import build_task, load_splits
from paczero.zo import Perturber, two_point_scalars


def test_bench_smoke():
    res = measure(BenchConfig(model="tiny-llama", n=8, steps=1, scaling=False, memory=False, plain=False), log=lambda s: None)
    assert res["floor_s"] > 0 and res["step_s"] > 0 and res["ratio"] > 0 and res["privacy_s"] >= 0
    assert "tiny-llama" in table([res])


@pytest.mark.parametrize("track", ["ft", "lora"])
def test_cached_sequential_and_lockstep_paths_agree(track):
    """The evaluation paths share one arithmetic: the cached block, one forward at a time and lock-step
    waves give bit-identical scalars, loss and updated weights."""
    lm = load_model("tiny-opt", track=track)
    task = build_task("demo", lm.tokenizer)
    train, _, _ = load_splits("demo", n_train=12, n_dev=1, n_test=1)
    batches = task.make_batches(task.encode(train), token_budget=64)
    assert len(batches) > 2
    params = trainable_parameters(lm.model, track)
    start = [p.detach().clone() for _, p in params]
    out = {}
    for path, lockstep in (("cached", 1), ("sequential", 0), ("lockstep", 2)):
        with torch.no_grad():
            for (_, p), w in zip(params, start):
                p.copy_(w)
        pert = Perturber(lm.model, params, public_seed=3, cache_limit=(1 << 30) if path == "cached" else 0,
                         lockstep=lockstep)
        assert pert.cache == (path == "cached")
        g, loss = two_point_scalars(pert, 0, 2, 1e-2, batches, lambda b: task.losses(lm.model, b), 12, "cpu")
        pert.apply_update(0, [1.0, -1.0], lr=1e-2)
        out[path] = (g, loss, [p.detach().clone() for _, p in params])
        pert.remove()
    (g1, l1, w1), (g2, l2, w2), (g3, l3, w3) = out["cached"], out["sequential"], out["lockstep"]
    assert np.array_equal(g1, g2) and np.array_equal(g1, g3) and l1 == l2 == l3 and np.all(g1 != 0)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(w1, w2, w3))
    assert not all(torch.equal(a, b) for a, b in zip(w1, start))


def test_floor_and_step_use_the_inference_batching():
    """The floor is the task's inference batching (padding capped at 10 %), and the step scores the
    same micro-batches (full fine-tuning on CPU no longer fills them to the budget)."""
    from paczero.bench import Harness

    h = Harness(BenchConfig(model="tiny-opt", track="ft", n=64, token_budget=256))
    capped = h.task.make_batches(h.universe, token_budget=256, max_padding=0.1)
    uncapped = h.task.make_batches(h.universe, token_budget=256, max_padding=None)
    assert len(capped) != len(uncapped)  # the cap matters for this universe
    assert [b.num_tokens for b in h.floor_batches] == [b.num_tokens for b in capped]
    assert [b.num_tokens for b in h.batches] == [b.num_tokens for b in capped]

def test_random_init_reads_only_the_config_and_tokenizer(tmp_path):
    """``--random-init``: an architecture folder with no weights (as benchmarks/arch_folders.py writes)
    builds a seeded random model of that shape; the bench runs on it; a folder without a config is one
    clear error."""
    from transformers import OPTConfig

    from paczero.models import load_tokenizer

    folder = tmp_path / "arch"
    tok = load_tokenizer("tiny-opt")
    OPTConfig(vocab_size=len(tok), hidden_size=32, word_embed_proj_dim=32, num_hidden_layers=1, ffn_dim=64,
              num_attention_heads=2, max_position_embeddings=512).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert not list(folder.glob("*.safetensors"))
    a = load_model(str(folder), track="ft", random_init=True, init_seed=1).model
    b = load_model(str(folder), track="ft", random_init=True, init_seed=1).model
    c = load_model(str(folder), track="ft", random_init=True, init_seed=2).model
    assert a.config.hidden_size == 32 and sum(p.numel() for p in a.parameters()) > 0
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))
    res = measure(BenchConfig(model=str(folder), random_init=True, track="ft", n=8, steps=1, scaling=False,
                              memory=False, plain=False), log=lambda s: None)
    assert res["ratio"] > 0 and "(random init)" in table([res])
    empty = tmp_path / "empty"
    empty.mkdir()
    tok.save_pretrained(empty)
    with pytest.raises(ValueError, match="cannot load the config"):
        load_model(str(empty), track="ft", random_init=True)


def test_arch_folders_never_overwrite(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "arch_folders", Path(__file__).parent.parent / "benchmarks" / "arch_folders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mine = tmp_path / "opt-1.3b"
    mine.mkdir()
    (mine / "config.json").write_text("{}")  # a user's file
    with pytest.raises(SystemExit, match="not empty"):
        mod.write(tmp_path, names=("opt-1.3b",))
    assert (mine / "config.json").read_text() == "{}"
    made = mod.write(tmp_path / "fresh", names=("opt-1.3b", "opt-6.7b"))
    assert {p.name for p in made} == {"opt-1.3b", "opt-6.7b"}
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(tmp_path / "fresh" / "opt-6.7b")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.ffn_dim) == (4096, 32, 16384)


def test_memory_repeats_alternate_phases_and_compare_medians(monkeypatch):
    """``--memory-repeats K``: K fresh processes per phase, inference and train alternating; the ratio is
    that of the medians (the resident peak of the same code scatters between processes)."""
    import paczero.bench as bench
    calls = []
    peaks = {"inference": iter([100, 130, 110]), "train": iter([150, 120, 400])}

    def fake(cfg, phase, live=False):
        calls.append(phase)
        return {"peak_bytes": next(peaks[phase]) << 20, "before_bytes": 0, "peak_reset": True, "kind": "test"}

    monkeypatch.setattr(bench, "memory_phase", fake)
    res = measure(BenchConfig(model="tiny-llama", n=8, steps=1, scaling=False, memory_repeats=3, plain=False), log=lambda s: None)
    assert calls == ["inference", "train"] * 3
    assert res["memory"]["inference"]["peaks_bytes"] == [100 << 20, 110 << 20, 130 << 20]
    assert res["memory_ratio"] == 150 / 110  # medians: 110 and 150 (the 400 outlier does not count)


def test_live_peak_bytes_is_what_is_held_at_once():
    """--live-memory's measure: the highest running sum of the profiler's allocations and frees."""
    from paczero.bench import live_peak_bytes

    def in_turn():  # 10 MiB, freed; then 5 and 7 MiB together
        a = torch.empty(10 << 20, dtype=torch.uint8)
        del a
        b, c = torch.empty(5 << 20, dtype=torch.uint8), torch.empty(7 << 20, dtype=torch.uint8)
        del b, c

    held = []

    def kept():  # control: the same three tensors, all kept
        held.extend(torch.empty(n << 20, dtype=torch.uint8) for n in (10, 5, 7))

    assert live_peak_bytes(in_turn) == 12 << 20
    assert live_peak_bytes(kept) == 22 << 20


def test_live_memory_phase_sees_the_cached_direction():
    """The train phase's live peak holds at least the weights and the step's cached z (4 bytes per trained
    value, drawn by the worker threads into a tensor the calling thread allocates); the inference phase's
    stays below that."""
    from dataclasses import asdict

    from paczero.bench import _memory_child
    cfg = BenchConfig(model="tiny-llama", track="ft", n=8, steps=1)
    train = _memory_child(asdict(cfg), "train", live=True)
    inference = _memory_child(asdict(cfg), "inference", live=True)
    lm = load_model("tiny-llama", track="ft")
    d = sum(p.numel() for _, p in trainable_parameters(lm.model, "ft"))
    assert train["before_bytes"] == inference["before_bytes"] >= 4 * d
    assert train["peak_bytes"] >= train["before_bytes"] + 4 * d
    assert inference["before_bytes"] < inference["peak_bytes"] < train["before_bytes"] + 4 * d


@pytest.mark.parametrize("argv,needle", [(["--live-memory", "--no-memory"], "drop --no-memory"),
                                         (["--track", "ft", "--compile"], "--track lora"),
                                         (["--task", "squad", "--compile"], "classification")])
def test_bench_flags_that_do_not_combine_give_one_line_exit_2(argv, needle, capsys):
    from paczero.cli import main
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_live_memory_ratio_is_reported_beside_the_resident_one(monkeypatch):
    import paczero.bench as bench
    calls = []

    def fake(cfg, phase, live=False):
        calls.append((phase, live))
        peak = {("inference", False): 100, ("train", False): 130, ("inference", True): 80, ("train", True): 84}
        return {"peak_bytes": peak[(phase, live)] << 20, "before_bytes": 0, "peak_reset": True, "kind": "test"}

    monkeypatch.setattr(bench, "memory_phase", fake)
    res = measure(BenchConfig(model="tiny-llama", n=8, steps=1, scaling=False, live_memory=True, plain=False),
                  log=lambda s: None)
    assert calls == [("inference", False), ("train", False), ("inference", True), ("train", True)]
    assert res["memory_ratio"] == 1.3 and res["live_memory_ratio"] == 84 / 80
    assert "1.050 (84/80 MiB)" in table([res])


@pytest.mark.parametrize("argv", [["--memory-repeats", "0"], ["--steps", "0"], ["--world", "0"], ["--threads", "0"]])
def test_bench_bad_values_and_an_existing_json_out_give_exit_2(argv, tmp_path, capsys):
    from paczero.cli import main
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "must be >= 1" in err
    out = tmp_path / "mine.json"
    out.write_text("my results")
    assert main(["bench", "--json-out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "my results"


def test_scaling_figures_say_their_clock_and_base():
    """The 2N and 2M figures come with the base they are ratios of and the clock they were timed on
    (process CPU time on CPU), so the JSON reads without the code: with one round, n_scaling is
    step_2n_s / scaling_base_s."""
    res = measure(BenchConfig(model="tiny-llama", n=8, steps=1, scaling=True, memory=False, plain=False), log=lambda s: None)
    assert res["scaling_clock"] == "cpu"
    assert res["n_scaling"] == pytest.approx(res["step_2n_s"] / res["scaling_base_s"])
    assert res["m_scaling"] == pytest.approx(res["step_2m_s"] / res["scaling_base_s"])


def test_bench_options_and_errors(capsys):
    """``paczero bench`` takes the benchmark's options; a bad one is one error line, exit 2."""
    import paczero.cli as cli

    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0 and "--memory-repeats" in capsys.readouterr().out
    assert cli.main(["bench", "--steps", "0"]) == 2  # the benchmark's own check of its arguments
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps must be >= 1" in err[0]


def test_the_parser_loads_no_torch_and_no_benchmark_code(tmp_path):
    """Building the command line's parser (every ``paczero`` command does) loads neither torch nor the
    benchmark."""
    import subprocess
    import sys

    light = subprocess.run([sys.executable, "-c", "import sys; from paczero.cli import _build_parser; "
                            "_build_parser().parse_args(['bench', '--model', 'x']); "
                            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m == 'paczero.bench'))"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "[]"


def test_the_floor_against_a_plain_transformers_forward():
    """The plain forward runs in its own process on the same rows (as many micro-batches as the floor) with
    the same threads, and the reported ratio is the floor pass's time over the plain pass's beside it (one
    pair with ``steps=1``)."""
    import os

    res = measure(BenchConfig(model="tiny-llama", n=8, steps=1, scaling=False, memory=False), log=lambda s: None)
    assert res["plain_s"] > 0 and res["plain_micro_batches"] == res["floor_micro_batches"]
    assert res["plain_threads"] == res["torch_threads"] == (int(os.environ.get("OMP_NUM_THREADS") or 0)
                                                            or len(os.sched_getaffinity(0)))
    assert res["floor_vs_plain"] == pytest.approx(res["plain_floor_s"] / res["plain_s"])
    assert res["floor_vs_plain_pairs"] == [round(res["floor_vs_plain"], 4)]
    assert "floor/plain" in table([res])


def test_the_plain_forward_reads_the_benchs_own_file(tmp_path, monkeypatch):
    """With ``--data`` (a classification file of your own) the plain forward scores that file's rows with the
    bench's prompt and answer words, as many micro-batches as the floor; a plain process that dies ends the bench
    with one error, not a wait. Mutation that turns it red: the plain child loading the task's built-in data
    (it has none: the child raised and the parent waited on its pipe for ever)."""
    import json

    from paczero.bench import plain as plain_module

    data = tmp_path / "topics.jsonl"
    words = ["alpha beta gamma", "delta", "epsilon zeta", "eta theta iota kappa"]
    data.write_text("".join(json.dumps({"text": f"item {i} " + words[i % 4] * (1 + i % 3), "label": ["A", "B/C"][i % 2]})
                            + "\n" for i in range(12)))
    cfg = BenchConfig(model="tiny-llama", n=8, steps=1, scaling=False, memory=False, task="classification",
                      data=str(data), labels=["A", "B/C"], verbalizer={0: " A", 1: " B/C"}, template="{sentence} ->")
    res = measure(cfg, log=lambda s: None)
    assert res["plain_s"] > 0 and res["plain_micro_batches"] == res["floor_micro_batches"]
    monkeypatch.setattr(plain_module, "_plain_child", _dying_child)
    with pytest.raises(RuntimeError, match="plain forward's process ended"):
        plain_module.floor_against_plain(cfg, lambda: (0.0, 0.0), 1)


def _dying_child(cfg_dict, threads, conn):
    raise SystemExit(3)


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """The wheel built from this checkout (``pip wheel``), installed with no dependencies into a fresh venv (which
    sees this environment's torch and transformers through a path file, not this checkout): the venv, a folder
    outside the source tree to run in, and the environment to run with."""
    import os
    import site
    import subprocess
    import sys

    import shutil

    tmp_path = tmp_path_factory.mktemp("wheel")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    src = tmp_path / "src"  # a copy of what the wheel is built from: no build/ of an earlier build comes along
    shutil.copytree(root / "paczero", src / "paczero", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, env=env, cwd=tmp_path, capture_output=True)
    wheel = next((tmp_path / "dist").glob("paczero-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    here = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, env=env, capture_output=True, text=True).stdout.strip()
    # this environment's packages (torch, transformers, peft) after the venv's own: a plain path, so that the
    # editable install of this checkout that the environment may hold (a .pth hook) is not run
    (Path(here) / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   env=env, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    return venv, work, env


def test_the_built_wheel_runs_paczero_bench_outside_the_source_tree(installed_wheel):
    """The wheel holds ``paczero bench``: ``paczero bench --model tiny-llama --track lora --n 16 --steps 1`` runs in
    a folder outside the source tree, from the installed package, and prints its ratio. Red when the
    benchmark is left out of the wheel (it lived in the checkout's benchmarks/) or imports from outside
    the package."""
    import subprocess

    venv, work, env = installed_wheel
    root = Path(__file__).resolve().parents[1]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import paczero.bench; print(paczero.bench.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(root)
    out = subprocess.run([str(venv / "bin" / "paczero"), "bench", "--model", "tiny-llama", "--track", "lora",
                          "--n", "16", "--steps", "1"], cwd=work, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ratio" in out.stderr and "floor/plain" in out.stderr
    row = [line for line in out.stdout.splitlines() if line.startswith("| tiny-llama")]
    assert len(row) == 1 and float(row[0].split("|")[8]) > 0  # the ratio column


#: the public names (README, docs/api.md) and a module of every room, imported from the installed wheel
PUBLIC_IMPORTS = """
from paczero import PACZeroTrainer, TrainResult, TrainConfig, ConfigError
import paczero.models, paczero.config, paczero.train, paczero.cli, paczero.evaluate
assert callable(paczero.models.load_model) and callable(paczero.train.train)
assert paczero.config.TrainConfig is TrainConfig
from paczero.run.build import build
from paczero.machine.hardware import set_threads
from paczero.privacy.subsets import balanced_design
from paczero.privacy.statement import privacy_statement_text
from paczero.audit.membership import audit
from paczero.audit.heldout import heldout_audit
from paczero.audit.lsb_attack import audit_transcript
from paczero.experiments.sweep import sweep
from paczero.experiments.report import write_report
from paczero.experiments.regime import regime_command
from paczero.recipes import list_recipes
assert list_recipes()
print(paczero.models.__file__)
"""


def test_the_built_wheel_serves_the_public_imports_and_every_room(installed_wheel):
    """From the installed wheel, outside the source tree: ``from paczero import PACZeroTrainer``,
    ``paczero.models.load_model``, ``paczero.config.TrainConfig``, ``paczero.train.train``, a module of every room
    (run, machine, privacy, audit, experiments) and the recipes; ``python -m paczero --version`` and the ``paczero``
    command. Red when a room is left out of the wheel or a public path moved."""
    import subprocess

    venv, work, env = installed_wheel
    py = str(venv / "bin" / "python")
    out = subprocess.run([py, "-c", PUBLIC_IMPORTS], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()).is_relative_to(venv)
    for cmd in ([py, "-m", "paczero", "--version"], [str(venv / "bin" / "paczero"), "--version"]):
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "paczero" in (done.stdout + done.stderr).lower(), done.stderr[-2000:]


def test_gloo_exit_counts_the_exit_codes_of_each_pair_of_ranks(capsys):
    """benchmarks/gloo_exit.py: two gloo ranks meet, destroy their group and exit with code 2; the benchmark
    counts both exits of each pair (one JSON line per mode). Red if a rank's exit is not counted or the
    ranks never meet (they would hang, or exit otherwise)."""
    import json

    from benchmarks.gloo_exit import main

    assert main(["--modes", "destroy", "--runs", "1"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line == {"mode": "destroy", "runs": 1, "exit_codes": {"2": 2}}


def test_bench_dp_sgd_against_the_zeroth_order_step_on_the_same_rows(monkeypatch):
    """`paczero bench --mechanism dp-sgd`: both steps timed on the same N rows (the DP-SGD step's Poisson batch at
    rate 1 is the whole universe), their peaks in fresh processes, and the table names both. Red when the DP-SGD
    step scores another number of rows than the zeroth-order step, or a phase is not measured."""
    from paczero.bench import first_order, memory
    from paczero.fo import dpsgd_step as fo

    rows = []
    real = fo.dpsgd_step
    monkeypatch.setattr(fo, "dpsgd_step", lambda batches, **kw: rows.append(sum(len(b.index) for b in batches))
                        or real(batches, **kw))
    phases = []
    monkeypatch.setattr(memory, "memory_phase", lambda cfg, phase, live=False: phases.append((cfg.mechanism, phase))
                        or {"peak_bytes": 2 ** 20 * (3 if phase == "dp-sgd" else 2)})
    res = measure(BenchConfig(model="tiny-llama", n=8, steps=2, mechanism="dp-sgd", scaling=False, plain=False),
                  log=lambda s: None)
    assert rows == [8, 8, 8]  # the warm-up and two timed steps, each of all N rows
    assert res["rows"] == 8 and res["zo_step_s"] > 0 and res["dpsgd_step_s"] > 0 and res["ratio"] > 0
    assert phases == [("pac-zpl", "train"), ("pac-zpl", "dp-sgd")]
    assert res["memory_ratio"] == 1.5
    text = first_order.first_order_table([res])
    assert "DP-SGD step s" in text and "tiny-llama" in text


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
def test_mfu_counts_a_forward_as_torchs_flop_counter_does(name):
    """The useful FLOPs of a forward over padded micro-batches (:func:`paczero.bench.mfu.forward_flops`) equal an
    independent count: torch's ``FlopCounterMode`` over each row's real tokens alone, through the model body
    with eager attention (no LM head, no padding), plus 2 FLOPs a token for each 1-D parameter (biases and
    norms, which the counter, counting matrix products only, does not see); a LoRA model counts the same (its
    adapters are not model FLOPs). Red if padded tokens are counted (``numel`` of the mask in place of its
    sum), the attention term is dropped or halved, or the embeddings, the LM head or the adapters are counted
    as parameters."""
    from torch.utils.flop_counter import FlopCounterMode

    from paczero.bench.mfu import forward_flops
    from paczero.models import hf_model

    lm = load_model(name, track="ft")
    hf = hf_model(lm.model)
    hf.set_attn_implementation("eager")  # attention as matrix products, which the counter sees
    task = build_task("demo", lm.tokenizer)
    train, _, _ = load_splits("demo", n_train=12, n_dev=1, n_test=1)
    batches = task.make_batches(task.encode(train), token_budget=64)
    assert any(b.attention_mask.sum() < b.attention_mask.numel() for b in batches)  # padding to leave out
    vectors = sum(p.numel() for p in hf.parameters() if p.ndim == 1)
    theirs = 0
    for b in batches:
        for ids, mask in zip(b.input_ids, b.attention_mask):
            real = ids[mask.bool()][None]
            with torch.inference_mode(), FlopCounterMode(display=False) as counter:
                hf.base_model(input_ids=real, use_cache=False)
            theirs += counter.get_total_flops() + 2 * vectors * real.shape[1]
    assert forward_flops(lm.model, batches) == theirs
    assert forward_flops(load_model(name, track="lora").model, batches) == theirs


def test_every_bench_row_reports_mfu_against_the_rates_it_measured(tmp_path, capsys):
    """``paczero bench --json-out``: each row holds ``mfu``, the matmul rates it divides by and what it counts,
    and the table prints it, beside the machine's load. The figures agree with each other: mfu = step FLOPs / step seconds / the 2048³
    rate, mfu_shape the same over the model-shape rate, the step's FLOPs 2 × K forwards. Red if a row lacks
    them or divides by another rate or time."""
    from paczero.bench import main

    out = tmp_path / "bench.json"
    assert main(["--model", "tiny-llama", "--track", "ft", "lora", "--n", "8", "--steps", "1", "--no-scaling",
                 "--no-memory", "--no-plain", "--num-directions", "2", "--json-out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert len(rows) == 2 and "MFU" in printed
    for r in rows:
        assert r["step_flops"] == 4 * r["forward_flops"] > 0 and "non-embedding" in r["flops_counted"]
        assert r["matmul_tflops_2048"] > 0 and r["matmul_tflops_shape"] > 0 and r["matmul_shape"][1:] == [64, 128]
        assert r["mfu"] == pytest.approx(r["step_flops"] / r["step_s"] / 1e12 / r["matmul_tflops_2048"])
        assert r["mfu_shape"] == pytest.approx(r["step_flops"] / r["step_s"] / 1e12 / r["matmul_tflops_shape"])
        assert r["floor_mfu"] == pytest.approx(r["forward_flops"] / r["floor_s"] / 1e12 / r["matmul_tflops_2048"])
        assert f"{r['mfu']:.1%}" in printed
        assert len(r["load_average"]) == 2  # the machine's load around the timings, which it may have shared


def test_matmul_rate_is_the_flops_of_one_product_over_its_best_group(monkeypatch):
    """The rate MFU divides by: 2·m·k·n over the time per product of the best timed group. The products and
    the clock are simulated (the warm-up 3 ms, the products of one timed group 2 ms each, all others 1 ms), so
    no timing is tested. Red if a product's FLOPs are counted otherwise, or the slowest group, or the
    warm-up, sets the rate."""
    from types import SimpleNamespace

    from paczero.bench import mfu

    clock, calls = [0.0], []

    def product(a, b, out=None):
        n = len(calls)
        calls.append(n)
        clock[0] += 3e-3 if n == 0 else 2e-3 if 64 <= n < 96 else 1e-3

    monkeypatch.setattr(mfu, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(torch, "matmul", product)
    rate = mfu.matmul_tflops(8, 4, 2, dtype=torch.float32, device="cpu", min_s=0)
    assert len(calls) > 96  # the slow group (products 64..95) was among those timed
    assert rate == pytest.approx(2 * 8 * 4 * 2 / 1e-3 / 1e12)


def test_the_warm_up_beyond_a_timed_step_is_reported_as_the_compilation():
    """``--compile`` compiles in the warm-up floor pass and step, which the timings drop; the bench reports what
    they took beyond a timed floor pass and step (wall and process CPU) and, with ``--compile``, says so in a line.
    Fed here: warm-up floor 5 s (CPU 4), warm-up step 10 s (CPU 9), then floors of 1 s (CPU 0.5) and steps of 2 s
    (CPU 1.5): (5 - 1) + (10 - 2) = 12 s, CPU (4 - 0.5) + (9 - 1.5) = 11 s. Red if the warm-ups are not kept (the
    fields missing) or are compared with anything but the timed medians."""
    from paczero.bench import _step_against_floor

    class FakeHarness:
        calls = 0
        last_cpu_s = 0.0

        def floor_pass(self):
            self.calls += 1
            wall, self.last_cpu_s = (5.0, 4.0) if self.calls == 1 else (1.0, 0.5)
            return wall

    def one_step(step):
        wall, cpu = (10.0, 9.0) if step == 0 else (2.0, 1.5)
        return {"step_s": wall, "step_cpu_s": cpu, "scalars_s": 1.0, "privacy_s": 0.0, "update_s": 1.0}

    lines = []
    res = _step_against_floor(BenchConfig(compile=True, steps=3), FakeHarness(), one_step, lines.append)
    assert res["warmup_extra_s"] == 12.0 and res["warmup_extra_cpu_s"] == 11.0
    assert any("compilation" in line and "12.0s, cpu 11.0s" in line for line in lines)
    lines.clear()
    _step_against_floor(BenchConfig(compile=False, steps=3), FakeHarness(), one_step, lines.append)
    assert not any("compilation" in line for line in lines)
