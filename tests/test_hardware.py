"""dtype auto, μ by dtype, threads that fit the machine, and the public mode of the model cache."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paczero.machine import hardware
from paczero.config import TrainConfig
from paczero.train import train

TINY = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=4, eval_every=2,
            checkpoint_every=2, num_subsets=4, private_seed=3, progress=False, eval_zero_shot=False)


@pytest.mark.parametrize("flags, dtype, mu", [({"avx2", "fma"}, "fp32", 1e-3), ({"avx2", "avx512_bf16"}, "bf16", 1e-2),
                                              ({"avx2", "amx_bf16", "amx_tile"}, "bf16", 1e-2),
                                              ({"fp", "asimd", "bf16"}, "bf16", 1e-2)])
def test_auto_is_bf16_only_where_the_cpu_has_it_and_mu_follows(monkeypatch, flags, dtype, mu):
    """``dtype: auto`` on a CPU is bf16 exactly when its flags name native bf16 (AVX512-BF16, AMX, Arm BF16),
    μ unset is the one that fits (1e-2 in bf16, 1e-3 in fp32), and one line says which and why. Red if
    auto picked bf16 on an AVX2-only CPU (34x slower matmuls) or kept μ = 1e-3 in bf16."""
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    echo = io.StringIO()
    cfg = hardware.resolve_precision(TrainConfig(), "cpu", echo=echo)
    assert (cfg.dtype, cfg.mu) == (dtype, mu)
    line = echo.getvalue().strip().splitlines()
    assert len(line) == 1 and line[0].startswith(f"paczero: dtype auto: {dtype}, mu {mu:g} (")
    assert ("no native bf16" in line[0]) == (dtype == "fp32")
    given = hardware.resolve_precision(TrainConfig(mu=5e-3), "cpu", echo=io.StringIO())
    assert (given.dtype, given.mu) == (dtype, 5e-3)  # a mu that is given stays


def test_bf16_named_on_a_cpu_without_it_is_kept_with_one_warning(monkeypatch):
    """A recipe that names bf16 keeps it (reproduction); on a CPU without native bf16 one line says, before
    loading, how much slower it runs and how to choose fp32; where bf16 is native, nothing is said."""
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2"})
    echo = io.StringIO()
    cfg = hardware.resolve_precision(TrainConfig(dtype="bf16", mu=1e-2), "cpu", echo=echo)
    assert (cfg.dtype, cfg.mu) == ("bf16", 1e-2)
    lines = echo.getvalue().strip().splitlines()
    assert len(lines) == 1 and "without native bf16" in lines[0] and "slower" in lines[0]
    assert "--dtype fp32" in lines[0] and "--dtype auto" in lines[0]
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512_bf16"})
    echo = io.StringIO()
    assert hardware.resolve_precision(TrainConfig(dtype="bf16"), "cpu", echo=echo).mu == 1e-2
    assert echo.getvalue() == ""
    assert hardware.resolve_precision(TrainConfig(dtype="fp32"), "cpu", echo=echo).mu == 1e-3


def test_a_run_records_the_resolved_dtype_and_mu_and_a_resume_keeps_them(tmp_path, monkeypatch, capsys):
    """run.json's config holds what auto resolved to, not "auto"; a resume with auto on a machine that would
    resolve otherwise keeps the recorded dtype and μ (else the resume would be refused as a different run)."""
    expected = "bf16" if hardware.native_bf16("cpu")[0] else "fp32"
    import shutil

    out = tmp_path / "run"
    cfg = TrainConfig(**TINY, out_dir=str(out))
    train(cfg, log=lambda *a, **k: None)
    saved = json.loads((out / "run.json").read_text())["config"]
    assert (saved["dtype"], saved["mu"]) == (expected, hardware.MU_FOR_DTYPE[expected])
    assert f"paczero: dtype auto: {expected}" in capsys.readouterr().err
    other = {"avx512_bf16"} if expected == "fp32" else {"avx2"}
    monkeypatch.setattr(hardware, "cpu_flags", lambda: other)
    shutil.rmtree(out / "checkpoints" / "step-000004")  # as if stopped after step 2
    (out / "summary.json").unlink()
    summary = train(cfg.replace(resume=True), log=lambda *a, **k: None)
    assert "stopped_at" not in summary
    saved = json.loads((out / "run.json").read_text())["config"]
    assert (saved["dtype"], saved["mu"]) == (expected, hardware.MU_FOR_DTYPE[expected])


def test_threads_are_the_allowed_cores_unless_set(monkeypatch):
    """A process uses the cores its affinity allows; OMP_NUM_THREADS (torchrun's, a sweep worker's share)
    and ``threads`` (``--threads``) set the number. Red if torch's own default (the machine's physical
    cores) were kept: a process pinned to one core would run two threads on it."""
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert hardware.set_threads(None) == len(os.sched_getaffinity(0)) == torch.get_num_threads()
        assert hardware.set_threads(1) == 1 == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert hardware.set_threads(None) == 1
    finally:
        torch.set_num_threads(before)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: no affinity to narrow")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    pinned = subprocess.run([sys.executable, "-c", "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
                             "import torch; from paczero.machine.hardware import set_threads; set_threads(None); "
                             "print(torch.get_num_threads())"], env=env, capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"


def test_a_local_sweep_divides_the_cores_between_its_workers(monkeypatch, tmp_path):
    """With several workers (GPUs) on one machine, each cell's process gets its share of the allowed cores
    as OMP_NUM_THREADS (which paczero train's threads follow); one worker keeps them all, and an
    OMP_NUM_THREADS of the sweep's own environment is left as it is; CPU workers (``--workers``) set none, their
    trainings share the cores step by step. Red if GPU workers stop dividing, or CPU workers pin a count."""
    from paczero.experiments import sweep

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(sweep, "allowed_cores", lambda: 16)
    seen = []

    class Done:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def wait(self):
            return 0

    def fake_start(cmd, log_path, gpu=None, threads=None, dated=True):
        seen.append((gpu, sweep._child_env(gpu, threads).get("OMP_NUM_THREADS")))
        cmd[0].started = True
        return Done()

    monkeypatch.setattr(sweep, "_start", fake_start)

    class Cell:
        run_dir = tmp_path
        config_path = log_path = tmp_path / "x"

        started = False

        def state(self):
            return "done" if self.started else "new"

    journal = type("J", (), {"write": lambda self, *a, **k: {}, "mark": lambda self, *a: None})()
    monkeypatch.setattr(sweep, "train_command", lambda cell, resume: [cell])
    sweep._run_local([(Cell(), False), (Cell(), False)], [("0", "0"), ("1", "1")], journal, set())
    assert len(seen) == 2 and {threads for _, threads in seen} == {"8"}
    seen.clear()
    sweep._run_local([(Cell(), False)], [("cpu0", None)], journal, set())
    assert seen == [(None, None)]
    seen.clear()  # CPU workers set no count: the trainings divide the cores step by step (thread_share)
    sweep._run_local([(Cell(), False), (Cell(), False)], [("cpu0", None), ("cpu1", None)], journal, set())
    assert seen == [(None, None), (None, None)]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert sweep._child_env("0", 8)["OMP_NUM_THREADS"] == "3"


def test_the_converted_model_is_written_with_the_umask_mode(tmp_path, monkeypatch):
    """The cached safetensors copy of the offline model gets the mode of any new file (0644 under umask 022,
    0664 under 002), so that a shared cache works: transformers writes it 0600 (a renamed temporary file).
    The conversion is the real one, on a tiny model (the GGUF load replaced)."""
    import shutil

    import transformers

    from paczero import models

    real = models.cache_dir() / models.SMOLLM2
    cache = tmp_path / "cache"
    (cache / models.SMOLLM2).mkdir(parents=True)
    for f in real.iterdir():  # the tokenizer, converted once by the session's fixture
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, cache / models.SMOLLM2 / f.name)
    monkeypatch.setenv("PACZERO_CACHE", str(cache))
    tiny = transformers.AutoModelForCausalLM.from_config(models._tiny_config("tiny-llama", 256))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny)
    for umask, mode in ((0o022, 0o644), (0o002, 0o664)):
        shutil.rmtree(cache / models.SMOLLM2 / "model.safetensors", ignore_errors=True)
        (cache / models.SMOLLM2 / "model.safetensors").unlink(missing_ok=True)
        old = os.umask(umask)
        try:
            folder = models._smollm2_cached("model")
        finally:
            os.umask(old)
        assert (folder / "model.safetensors").stat().st_mode & 0o777 == mode
        assert all(f.stat().st_mode & 0o777 == mode for f in folder.iterdir() if f.is_file())


def test_a_sweep_takes_a_finished_auto_run_as_the_same_settings(tmp_path):
    """A finished run of a recipe with ``dtype: auto`` and no mu recorded what they resolved to; a later sweep
    of that recipe sees the same settings (not 'dtype 'fp32' -> 'auto''), but a run with another lr differs."""
    from paczero.experiments import sweep

    ran = json.loads(json.dumps(TrainConfig(dtype="fp32", mu=1e-3).to_dict()))
    (tmp_path / "summary.json").write_text(json.dumps({"config": ran}))
    cell = type("C", (), {"run_dir": tmp_path})()
    assert sweep._other_settings(cell, TrainConfig()) == ""
    assert sweep._other_settings(cell, TrainConfig(lr=5e-3)).startswith("lr ")
    assert sweep._other_settings(cell, TrainConfig(dtype="bf16")).startswith("dtype 'fp32' -> 'bf16'")


def test_a_sweep_takes_a_finished_template_auto_run_as_the_same_settings(tmp_path):
    """A finished run of a recipe with ``template: auto`` recorded the prompt and answer words it chose (and
    ``prompt.source: auto`` in summary.json); a later sweep of that recipe sees the same settings. Red if the
    sweep compares the chosen template with 'auto' ("template 'Text: ...' -> 'auto'"); a run whose prompt was
    given (no source auto) still differs from template auto, and so do answer words given beside auto."""
    from paczero.experiments import sweep

    chosen = {"0": " bad", "1": " good"}
    ran = json.loads(json.dumps(TrainConfig(dtype="fp32", mu=1e-3, template="Text: {sentence}\nLabel:",
                                            verbalizer=chosen).to_dict()))
    (tmp_path / "summary.json").write_text(json.dumps({"config": ran}))
    cell = type("C", (), {"run_dir": tmp_path})()
    assert sweep._other_settings(cell, TrainConfig(template="auto")).startswith("template ")  # given, not chosen
    (tmp_path / "summary.json").write_text(json.dumps({"config": ran, "prompt": {"source": "auto"}}))
    assert sweep._other_settings(cell, TrainConfig(template="auto")) == ""
    assert sweep._other_settings(cell, TrainConfig(template="auto", lr=5e-3)).startswith("lr ")
    words = {"0": " awful", "1": " fine"}
    assert sweep._other_settings(cell, TrainConfig(template="auto", verbalizer=words)).startswith("verbalizer ")


def _cli_train(tmp_path: Path, env: dict) -> tuple[dict, str]:
    """``paczero train`` of the tiny model with ``dtype: auto`` as a subprocess: its recorded config and stderr."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "paczero", "train", "--model", "tiny-llama", "--task", "demo", "--n-train", "16",
            "--n-dev", "8", "--n-test", "8", "--steps", "2", "--num-subsets", "4", "--eval-every", "2",
            "--private-seed", "3", "--no-progress", "--out-dir", str(out)]
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "run.json").read_text())["config"], done.stderr


@pytest.mark.parametrize("flags, dtype", [("", "fp32"), ("avx2 avx512_bf16", "bf16")])
def test_a_training_subprocess_resolves_auto_from_the_flags_the_test_names(tmp_path, flags, dtype):
    """The flags ``PACZERO_CPU_FLAGS`` names reach every process a test starts: ``paczero train`` as a
    subprocess resolves ``dtype: auto`` from them (fp32 with μ 1e-3, bf16 with μ 1e-2), whatever the host.
    Red if the CLI read /proc/cpuinfo despite the variable (one of the two cases gets the host's dtype),
    or if the conftest fixture only patched the flags in-process (the subprocess suite's trainings then
    resolve bf16 on a host with native bf16 and fp32 elsewhere)."""
    config, stderr = _cli_train(tmp_path, {**os.environ, hardware.CPU_FLAGS_ENV: flags})
    assert (config["dtype"], config["mu"]) == (dtype, hardware.MU_FOR_DTYPE[dtype])
    assert f"paczero: dtype auto: {dtype}" in stderr and hardware.CPU_FLAGS_ENV in stderr


def test_the_suite_runs_as_on_a_cpu_without_native_bf16():
    """The conftest fixture names no flags in the environment the tests and their subprocesses see. Red if
    the fixture is removed or patches the flags in-process only."""
    assert os.environ.get(hardware.CPU_FLAGS_ENV) == ""
    assert hardware.native_bf16("cpu")[0] is False


def _host_has_native_bf16() -> bool:
    """The host's own answer, read here from /proc/cpuinfo (not through paczero.machine.hardware)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines()
                      if line.startswith(("flags", "Features"))), []))
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


@pytest.mark.skipif(not _host_has_native_bf16(), reason="the host's CPU has no native bf16")
def test_on_a_host_with_native_bf16_auto_trains_in_bf16(tmp_path):
    """Where the host computes bf16 natively, a training with ``dtype: auto`` and no flags named resolves bf16
    with μ 1e-2 from /proc/cpuinfo and runs to its end (the bf16 path of the engine on this machine's own
    kernels). Red if the flags were read from anywhere but the CPU, or if bf16 training fails here."""
    env = {k: v for k, v in os.environ.items() if k != hardware.CPU_FLAGS_ENV}
    config, stderr = _cli_train(tmp_path, env)
    assert (config["dtype"], config["mu"]) == ("bf16", 1e-2)
    assert hardware.CPU_FLAGS_ENV not in stderr


def test_the_mu_line_is_said_only_where_mu_applies(monkeypatch):
    """`dtype auto` names μ for a zeroth-order training only: not for dp-sgd (a gradient step) nor for an
    evaluation (`mu_applies=False`: paczero eval, predict, audit). Red if the line names μ where it does not apply."""
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2", "fma"})
    for cfg, applies, said in ((TrainConfig(), True, True), (TrainConfig(mechanism="dp-sgd", epsilon=2.0), True, False),
                               (TrainConfig(), False, False)):
        echo = io.StringIO()
        hardware.resolve_precision(cfg, "cpu", echo=echo, mu_applies=applies)
        assert echo.getvalue().startswith("paczero: dtype auto: fp32") and (", mu " in echo.getvalue()) == said
