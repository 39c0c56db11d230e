"""The sweep: planning, overrides, skipping finished cells and resuming killed ones (tiny model)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from paczero.checkpoint import RunLock
from paczero.cli import main
from paczero.config import ConfigError
from paczero.experiments.slurm import slurm_parameters
from paczero.experiments.sweep import Cell, SlurmCell, expand_recipes, materialise, parse_overrides, plan, sweep, visible_gpus

TINY = ["model=tiny-llama", "task=demo", "n_train=16", "n_dev=8", "n_test=8", "steps=4", "eval_every=2",
        "num_subsets=4", "eval_zero_shot=false", "progress=false", "checkpoint_every=2", "track=ft"]


def journal(root: Path) -> list[dict]:
    """The cell records of the sweep journal (its own start and end marks left out)."""
    return [r for r in map(json.loads, (root / "sweep.jsonl").read_text().splitlines()) if "sweep" not in r]


def test_expand_recipes_names_globs_tables_and_paths(tmp_path):
    assert [n for n, _ in expand_recipes(["headline/sst2-opt1.3b-ft-zpl"])] == ["headline/sst2-opt1.3b-ft-zpl"]
    assert len(expand_recipes(["plateau"])) == 15  # a table name is every cell of it, not plateau-lora
    assert len(expand_recipes(["headline/sst2-*-ft-*"])) == 6
    f = tmp_path / "mine.yaml"
    f.write_text("mechanism: pac-zpl\n")
    assert expand_recipes([str(f)]) == [("mine", f)]
    with pytest.raises(ConfigError, match="no recipe matches"):
        expand_recipes(["no-such-table/*"])


def test_a_cells_config_names_its_recipe_and_folders_as_given_not_resolved(tmp_path, monkeypatch):
    """The config a sweep writes beside each run (``seed<k>.yaml``, which ``paczero report --keep-runs``
    publishes) names a shipped recipe by its path in the package, a YAML file and the out-root as typed. Red if
    either is resolved to an absolute path of the machine."""
    import yaml

    monkeypatch.chdir(tmp_path)
    Path("mine.yaml").write_text("mechanism: pac-zpl\nmodel: tiny-opt\ntask: demo\n")
    for pattern, source in (("headline/sst2-opt1.3b-ft-zpl", "paczero/recipes/headline/sst2-opt1.3b-ft-zpl.yaml"),
                            ("mine.yaml", "mine.yaml")):
        cell = plan([pattern], [1], "runs")[0]
        materialise(cell, {})
        written = yaml.safe_load(cell.config_path.read_text())
        assert written["recipe"]["source"] == source
        assert written["out_dir"] == f"runs/{cell.recipe}/seed1"


def test_overrides_are_typed_and_checked():
    o = parse_overrides(["steps=4", "eval_zero_shot=false", "clip=null", "lr=1e-4", "model=tiny-llama", "mu=0.01"])
    assert o == {"steps": 4, "eval_zero_shot": False, "clip": None, "lr": 1e-4, "model": "tiny-llama", "mu": 0.01}
    with pytest.raises(ConfigError, match="unknown key"):
        parse_overrides(["stepz=4"])
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])


def test_plan_layout_and_dry_run_validates(tmp_path):
    cells = plan(["dp-cliff/sst2-opt1.3b-ft-dpzero-k1-eps2"], [0, 2], tmp_path)
    assert [c.run_dir for c in cells] == [tmp_path / "dp-cliff/sst2-opt1.3b-ft-dpzero-k1-eps2" / f"seed{k}"
                                          for k in (0, 2)]
    lines = []
    sweep(["headline/sst2-opt1.3b-ft-zpl"], [1], out_root=str(tmp_path / "dry"), dry_run=True, echo=lines.append)
    assert "--data-seed 1" in lines[0] and not (tmp_path / "dry").exists()  # a dry run writes nothing
    cfg = materialise(plan(["headline/sst2-opt1.3b-ft-zpl"], [1], tmp_path)[0], {}, write=False)
    assert cfg.data_seed == 1 and cfg.lr == 1e-4 and cfg.num_subsets == 126 and not list(tmp_path.iterdir())
    with pytest.raises(ConfigError):  # a bad override fails before anything runs
        sweep(["headline/sst2-opt1.3b-ft-zpl"], [0], out_root=str(tmp_path), overrides={"steps": 0}, dry_run=True)


def test_a_sweep_seed_sets_the_field_its_recipe_names(tmp_path):
    """The paper's recipes (``seed_field: data_seed``): seed k draws other examples and keeps the recipe's public
    seed (directions, initialisation); a recipe without the header key: seed k is the public seed, data_seed the
    recipe's. The materialised config and the train command say the same. Red if a sweep seed always set ``seed``
    (the paper's seeds varied the data) or never did (a user's recipe would lose its meaning)."""
    from paczero.experiments.sweep import train_command

    paper = plan(["headline/sst2-opt6.7b-ft-mi0.33"], [42], tmp_path)[0]
    cfg = materialise(paper, {"seed": 5})
    assert (cfg.data_seed, cfg.seed) == (42, 5)
    assert yaml.safe_load(paper.config_path.read_text())["recipe"]["seed_field"] == "data_seed"
    assert train_command(paper, resume=False)[6:8] == ["--data-seed", "42"]
    own = tmp_path / "own.yaml"
    own.write_text("recipe: {name: own}\ntask: demo\nmodel: tiny-llama\ndata_seed: 3\n")
    mine = plan([str(own)], [2], tmp_path)[0]
    cfg = materialise(mine, {}, write=False)
    assert (cfg.seed, cfg.data_seed) == (2, 3) and train_command(mine, resume=False)[6:8] == ["--seed", "2"]
    own.write_text("recipe: {name: own, seed_field: lr}\ntask: demo\n")
    with pytest.raises(ConfigError, match="seed_field must be one of seed, data_seed"):
        materialise(plan([str(own)], [2], tmp_path)[0], {}, write=False)


def test_a_weak_start_tables_sweep_seed_sets_the_data_seed_and_the_public_seed(tmp_path):
    """cpu-agnews and cpu-sst5 recipes name both fields (``seed_field: [data_seed, seed]``): seed k draws other
    rows and other public directions, in the materialised config, its header and the train command alike; a
    list naming a field twice or an unknown one is refused. Red if a list set only its first field (the seeds
    would share their directions, as the SST-2 table's did) or the command passed one flag."""
    from paczero.experiments.sweep import train_command

    cell = plan(["cpu-agnews/lora-zpl-skip-m16-lr2e-2"], [2], tmp_path)[0]
    (tmp_path / "a.jsonl").write_text('{"text": "a", "label": 0}\n')
    cfg = materialise(cell, {"data": str(tmp_path / "a.jsonl"), "seed": 7})
    assert (cfg.data_seed, cfg.seed) == (2, 2)
    assert yaml.safe_load(cell.config_path.read_text())["recipe"]["seed_field"] == ["data_seed", "seed"]
    cmd = train_command(cell, resume=False)
    assert cmd[6:10] == ["--data-seed", "2", "--seed", "2"], cmd
    own = tmp_path / "own.yaml"
    for bad in ("[seed, seed]", "[data_seed, lr]", "[]"):
        own.write_text(f"recipe: {{name: own, seed_field: {bad}}}\ntask: demo\n")
        with pytest.raises(ConfigError, match="seed_field must be one of seed, data_seed or a list"):
            materialise(plan([str(own)], [2], tmp_path)[0], {}, write=False)


def test_visible_gpus(monkeypatch):
    assert visible_gpus(None) is None
    assert visible_gpus("0,3") == ["0", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus("auto") == ["2", "5"]


@pytest.mark.slow
def test_sweep_runs_skips_finished_and_resumes_killed(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    # private_seed fixed: resuming a PAC run with an OS-entropy secret is the engine's job (see train.py);
    # this test is about the sweep's decisions
    recipe.write_text("recipe: {name: tiny}\nmechanism: pac-mi\nmi_budget: 0.05\nlr: 0.001\nprivate_seed: 7\n")
    root = tmp_path / "runs"
    overrides = parse_overrides(TINY)
    res = sweep([str(recipe)], [0], out_root=str(root), overrides=overrides, echo=lambda s: None)
    assert [r["status"] for r in res] == ["done"]
    cell = Cell("tiny", recipe, 0, root)
    assert cell.state() == "done" and (cell.run_dir / "summary.json").exists()

    # finished: skipped without starting a process
    res = sweep([str(recipe)], [0], out_root=str(root), overrides=overrides, echo=lambda s: None)
    assert [r["status"] for r in res] == ["skipped"]

    # killed after the last step was logged: no summary, newest checkpoint lost (the resume replays steps 3-4)
    (cell.run_dir / "summary.json").unlink()
    shutil.rmtree(cell.run_dir / "checkpoints" / "step-000004")
    assert cell.state() == "killed"
    res = sweep([str(recipe)], [0], out_root=str(root), overrides=overrides, echo=lambda s: None)
    assert [(r["status"], r["resumed"]) for r in res] == [("done", True)]
    assert "--resume" in cell.log_path.read_text()
    assert "resuming from step 4 (weights of step 2, 2 logged steps replayed)" in cell.log_path.read_text()
    steps = [json.loads(line)["step"] for line in (cell.run_dir / "log.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # the transcript holds each step once
    summary = json.loads((cell.run_dir / "summary.json").read_text())
    assert summary["config"]["seed"] == 0 and summary["privacy"]["mi_spent"] <= 0.05 + 1e-9
    statuses = [r["status"] for r in journal(root)]
    raw = [json.loads(line) for line in (root / "sweep.jsonl").read_text().splitlines()]
    assert all("time" not in r for r in raw if "sweep" not in r)  # a cell's record: no clock time to bracket a run
    assert [r["sweep"] for r in raw if "sweep" in r][:2] == ["start", "end"] and all(r["time"] for r in raw if "sweep" in r)
    assert statuses == ["started", "done", "skipped", "started", "done"]


@pytest.mark.slow
def test_a_finished_cell_with_other_settings_is_skipped_with_a_word(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("recipe: {name: tiny}\nmechanism: pac-zpl\nlr: 0.001\n")
    root = tmp_path / "runs"
    sweep([str(recipe)], [0], out_root=str(root), overrides=parse_overrides(TINY), echo=lambda s: None)
    lines = []
    (rec,) = sweep([str(recipe)], [0], out_root=str(root), overrides=parse_overrides(TINY + ["lr=0.0005"]),
                   echo=lines.append)
    assert rec["status"] == "skipped" and "other settings (lr 0.001 -> 0.0005)" in rec["reason"]
    assert "use another --out-root" in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_on_the_sweep_stops_its_running_cell_with_a_checkpoint(tmp_path, sig):
    """A SIGINT (Ctrl-C) or SIGTERM (``kill PID``) to the sweep process alone (a cell runs detached from the
    terminal's process group) goes on to the running cell, which checkpoints after its step; the sweep waits
    for it, records 'stopped', takes no new cell and exits 130. Red if the cell runs on, orphaned, with
    nothing recorded: for SIGTERM, with SIGTERM left out of ``on_stop_signals``."""
    import subprocess
    import sys

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("recipe: {name: tiny}\nmechanism: pac-zpl\nlr: 0.001\n")
    root = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "paczero.cli", "sweep", str(recipe), "--seeds", "0", "1",
                             "--out-root", str(root), "--set", *TINY, "steps=400", "checkpoint_every=1000"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a suite started in the background inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = root / "tiny" / "seed0" / "log.jsonl"
    deadline = time.time() + 120
    while not log.exists() or _lines(log) < 3:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    statuses = [(r["seed"], r["status"]) for r in journal(root)]
    assert statuses == [(0, "started"), (0, "stopped")]  # seed 1 never started
    steps = _lines(log)
    assert steps < 400 and (root / "tiny" / "seed0" / "checkpoints" / f"step-{steps:06d}").is_dir()
    assert not RunLock.held(root / "tiny" / "seed0")  # the cell's process has ended


def test_stop_signals_are_handled_inside_the_block_only_and_an_ignored_sigint_stays_ignored():
    """``on_stop_signals`` hands SIGINT and SIGTERM to its handler, leaves a SIGINT that the process
    inherited ignored (a job started in the background) ignored, and restores both after the block, also
    when the block raises. Red if it overrides SIG_IGN or forgets to restore."""
    from paczero.run.stop import on_stop_signals

    def handler(signum, frame):
        pass

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a foreground run has it (a background job: ignored)
    try:
        with on_stop_signals(handler):
            assert signal.getsignal(signal.SIGINT) is handler and signal.getsignal(signal.SIGTERM) is handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with pytest.raises(RuntimeError), on_stop_signals(handler):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is handler
            raise RuntimeError
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is before[1]
    finally:
        signal.signal(signal.SIGINT, before[0])


@pytest.mark.slow
@pytest.mark.slow
def test_cpu_workers_run_cells_at_once_and_each_finishes_as_alone(tmp_path):
    """``workers=2`` on the CPU: both cells start before either ends (the journal's order), and each run's log
    equals, step for step, that of the same cell run alone (the trainings only divide the cores). Red if the
    workers are ignored (the second cell starts after the first is done) or if a worker sets another cell's
    environment (different published coefficients)."""
    recipes = []
    for i, mech in enumerate(("pac-zpl", "mezo")):
        recipes.append(tmp_path / f"c{i}.yaml")
        recipes[-1].write_text(f"recipe: {{name: c{i}}}\nmechanism: {mech}\nlr: 0.001\nprivate_seed: 7\n")
    overrides = parse_overrides(TINY)
    res = sweep([str(r) for r in recipes], [0], out_root=str(tmp_path / "two"), overrides=overrides, workers=2,
                echo=lambda s: None)
    assert sorted(r["status"] for r in res) == ["done", "done"]
    order = [(r["recipe"], r["status"]) for r in journal(tmp_path / "two")]
    assert {order[0][1], order[1][1]} == {"started"}, order
    alone = sweep([str(recipes[0])], [0], out_root=str(tmp_path / "one"), overrides=overrides, echo=lambda s: None)
    assert [r["status"] for r in alone] == ["done"]

    def coefficients(root: Path) -> list:
        rows = (root / "c0" / "seed0" / "log.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(r).items() if "second" not in k} for r in rows]
    assert coefficients(tmp_path / "two") == coefficients(tmp_path / "one")


def test_a_worker_skips_a_cell_another_sweep_finished_after_the_triage(tmp_path):
    """The queue is drawn up before the cells run; a cell another sweep over the same out-root finished
    meanwhile is skipped when a worker takes it, not run again. Red without the second look (the worker
    starts a run over a finished folder, which fails)."""
    from paczero.experiments.sweep import _Journal, _run_local

    recipe = tmp_path / "r.yaml"
    recipe.write_text("mechanism: pac-zpl\n")
    cell = Cell("r", recipe, 0, tmp_path / "runs")
    cell.run_dir.mkdir(parents=True)
    (cell.run_dir / "summary.json").write_text("{}")
    res = _run_local([(cell, False)], [("cpu0", None), ("cpu1", None)],
                     _Journal(tmp_path / "runs" / "sweep.jsonl", lambda s: None), set())
    assert [(r["status"], r["reason"]) for r in res] == [("skipped", "summary.json present")]
    assert not cell.log_path.exists()


def test_failed_cell_is_recorded_and_does_not_stop_the_sweep(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("mechanism: pac-zpl\nmodel: /nonexistent/model/folder\n")
    res = sweep([str(bad)], [0], out_root=str(tmp_path / "runs"), overrides=parse_overrides(TINY[1:]),
                echo=lambda s: None)
    assert [r["status"] for r in res] == ["failed"] and res[0]["returncode"] != 0


def test_a_sweep_with_a_dp_cell_publishes_no_cells_time(tmp_path):
    """Two cells that fail at once (a model folder that does not exist): with a DP cell among them, sweep.jsonl
    holds no cell's ``seconds`` and no cell log's header line a clock time, only the sweep's own start and end
    are timed; without one (the control), both are there. Red if the sweep drops only the DP cell's time (the
    other cell's seconds with the sweep's span give it), or dates a cell log's header (the next cell's start
    ends the DP cell)."""
    import re

    overrides = parse_overrides(["task=demo", "n_train=16", "steps=2", "progress=false", "model=/nonexistent/model"])
    (tmp_path / "pac.yaml").write_text("mechanism: pac-zpl\n")
    (tmp_path / "dp.yaml").write_text("mechanism: dpzero\nepsilon: 2.0\nsample_rate: 0.5\n")
    dated = re.compile(r"^# \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \$", re.M)

    def timed(names: list[str], root: Path) -> tuple[list, list]:
        res = sweep([str(tmp_path / f"{n}.yaml") for n in names], [0], out_root=str(root), overrides=overrides,
                    echo=lambda s: None)
        assert [r["status"] for r in res] == ["failed"] * len(names)
        headers = [bool(dated.search(Cell(n, tmp_path / f"{n}.yaml", 0, root).log_path.read_text())) for n in names]
        marks = [r for r in map(json.loads, (root / "sweep.jsonl").read_text().splitlines()) if "sweep" in r]
        assert [m["sweep"] for m in marks] == ["start", "end"] and all(m["time"] for m in marks)
        return ["seconds" in r for r in journal(root) if r["status"] == "failed"], headers

    assert timed(["pac", "dp"], tmp_path / "mixed") == ([False, False], [False, False])
    assert timed(["pac"], tmp_path / "pac-only") == ([True], [True])  # the control: a sweep of PAC cells is timed


# ---------------------------------------------------------------------------- SLURM
def test_slurm_parameters_are_checked():
    p = slurm_parameters(partition="gpu", timeout_min=60, gpus_per_node=0, extra=["exclude=n1,n2", "--qos=high"])
    assert p["gpus_per_node"] == 0 and p["timeout_min"] == 60 and p["slurm_partition"] == "gpu"
    assert p["slurm_additional_parameters"] == {"exclude": "n1,n2", "qos": "high"}  # commas stay in a value
    assert p["slurm_signal_delay_s"] == 300 and p["slurm_max_num_timeout"] == 20
    for bad, needle in [({"gpus_per_node": "0"}, "--gpus-per-node"), ({"timeout_min": 0}, "--timeout-min"),
                        ({"mem_gb": -1}, "--mem-gb"), ({"extra": ["constraint"]}, "KEY=VALUE"),
                        ({"extra": ["gpus_per_node=0"]}, "use --gpus-per-node"), ({"extra": ["time=10"]}, "--timeout-min"),
                        ({"timeout_min": 5, "signal_delay_s": 300}, "shorter than the time limit")]:
        with pytest.raises(ConfigError, match=needle):
            slurm_parameters(**bad)


@pytest.mark.parametrize("argv, needle", [
    (["--partition", "gpu"], "--partition applies to SLURM jobs: add --slurm"),
    (["--slurm-arg", "qos=high"], "--slurm-arg applies to SLURM jobs"),
    (["--slurm", "--gpus", "auto"], "with --slurm use --gpus-per-node"),
    (["--slurm", "--slurm-arg", "gpus_per_node=0"], "use --gpus-per-node"),
    (["--slurm"], "needs SLURM's sbatch on PATH"),
    (["--workers", "0"], "--workers expects a whole number of at least 1"),
    (["--workers", "2", "--gpus", "0,1"], "--workers runs cells at once on this machine's CPU cores"),
])
def test_bad_slurm_flags_stop_before_anything_runs(tmp_path, monkeypatch, capsys, argv, needle):
    """One line, exit code 2, nothing submitted and nothing run. Without sbatch, --slurm used to fall back
    to submitit's local executor and run the cells on this machine."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, squeue or srun
    root = tmp_path / "runs"
    assert main(["sweep", "headline/sst2-opt1.3b-ft-zpl", "--out-root", str(root)] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("paczero: error: ") and needle in err
    assert not (root / "sweep.jsonl").exists() and not (root / "slurm").exists()


WARNED = r"""
import os, signal, sys
import paczero.train as tr
from paczero.cli import main
_lr = tr.lr_at
def lr_at(cfg, step):
    if step == 3:  # SLURM's warning reaches the job's process (here: this one's parent) mid-step 3
        os.kill(os.getppid(), signal.SIGUSR2)
    return _lr(cfg, step)
tr.lr_at = lr_at
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_slurm_job_warned_of_its_time_limit_checkpoints_and_requeues_itself_to_resume(tmp_path, monkeypatch):
    """submitit's protocol, played here without SLURM: the job's process (this one) gets SIGUSR2 mid-run
    (SLURM's warning; the handler stands in for submitit's, which calls ``checkpoint`` and exits).
    ``checkpoint`` passes the warning on to the run, which stops after its step with a checkpoint, and
    returns the requeued call (``--resume``); that call ends with the transcript and weights of the
    uninterrupted run (the same private seed)."""
    import sys

    import paczero.experiments.sweep as sw

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("recipe: {name: tiny}\nmechanism: pac-mi\nmi_budget: 0.05\nlr: 0.001\nprivate_seed: 7\n")
    overrides = parse_overrides(TINY + ["steps=40", "eval_every=20", "checkpoint_every=1000"])
    reference = tmp_path / "reference"
    sweep([str(recipe)], [0], out_root=str(reference), overrides=overrides, echo=lambda s: None)

    wrapper = tmp_path / "warned.py"
    wrapper.write_text(WARNED)
    real = sw.train_command
    monkeypatch.setattr(sw, "train_command", lambda cell, resume: [sys.executable, str(wrapper)] + real(cell, resume=resume)[3:])
    cell = plan([str(recipe)], [0], tmp_path / "runs")[0]
    materialise(cell, overrides)
    job = SlurmCell(cell)
    requeued = []

    def submitit_handler(signum, frame):
        requeued.append(job.checkpoint(False))
        raise SystemExit(-1)

    old = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        with pytest.raises(SystemExit):
            job(False)
    finally:
        signal.signal(signal.SIGUSR2, old)  # the run's process is gone by now: no warning can come later
    stopped = _lines(cell.run_dir / "log.jsonl")  # the warning reaches the run during step 3 or soon after
    assert 4 <= stopped < 40 and f"stopped at step {stopped}: checkpoint written" in cell.log_path.read_text()
    assert (cell.run_dir / "checkpoints" / f"step-{stopped:06d}").is_dir()
    (delayed,) = requeued
    assert delayed.args == (True,) and delayed.function.cell == cell  # the requeued job resumes
    assert delayed.result() == 0
    ran, ref = cell.run_dir, reference / "tiny" / "seed0"
    assert _transcript(ran) == _transcript(ref)
    a, b = (load_file(str(d / "selected.safetensors")) for d in (ran, ref))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def _transcript(run: Path) -> list[dict]:
    recs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("seconds")
        r.pop("train_loss")  # a float32 diagnostic, summed in another order by another process
    return recs


@pytest.mark.skipif(not os.environ.get("PACZERO_TEST_SLURM_PARTITION") or shutil.which("sbatch") is None,
                    reason="needs a SLURM cluster: set PACZERO_TEST_SLURM_PARTITION (a CPU partition) where sbatch works")
@pytest.mark.slow
def test_on_a_real_slurm_cluster_a_warned_job_requeues_itself_and_finishes_the_run(tmp_path):
    """Through sbatch: a cell's job, sent SLURM's warning (``scancel --signal=USR2``, what SLURM sends
    ``--signal-delay-s`` before the time limit) mid-run, checkpoints, is requeued by submitit, resumes
    and ends with the uninterrupted run's transcript and weights. A sweep started again while the job
    is queued or running skips the cell. The out-root must be on a file system the nodes share."""
    import subprocess

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("recipe: {name: tiny}\nmechanism: pac-mi\nmi_budget: 0.05\nlr: 0.001\nprivate_seed: 7\n")
    overrides = parse_overrides(TINY + ["steps=300", "eval_every=100", "checkpoint_every=1000"])
    reference = tmp_path / "reference"
    sweep([str(recipe)], [0], out_root=str(reference), overrides=overrides, echo=lambda s: None)
    params = slurm_parameters(partition=os.environ["PACZERO_TEST_SLURM_PARTITION"], timeout_min=30, gpus_per_node=0,
                              cpus_per_task=1, mem_gb=2)
    root = tmp_path / "runs"
    (submitted,) = sweep([str(recipe)], [0], out_root=str(root), overrides=overrides, slurm=params, echo=lambda s: None)
    job = submitted["job_id"]
    (again,) = sweep([str(recipe)], [0], out_root=str(root), overrides=overrides, slurm=params, echo=lambda s: None)
    assert again["status"] == "skipped" and job in again["reason"]

    def job_state() -> str:
        out = subprocess.run(["squeue", "--noheader", "--array", "--format=%i %T"], capture_output=True, text=True)
        return dict(line.split() for line in out.stdout.splitlines()).get(job, "GONE")

    cell = plan([str(recipe)], [0], root)[0]
    deadline = time.time() + 600
    while not (cell.run_dir / "log.jsonl").exists() or _lines(cell.run_dir / "log.jsonl") < 3:
        assert time.time() < deadline and job_state() != "GONE", cell.log_path.read_text()[-2000:]
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    while job_state() not in ("PENDING", "GONE"):  # requeued (SLURM holds it back for a while)
        assert time.time() < deadline
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
    while not (cell.run_dir / "summary.json").exists():
        assert time.time() < deadline and job_state() != "GONE" or (cell.run_dir / "summary.json").exists(), \
            cell.log_path.read_text()[-2000:]
        time.sleep(0.5)
    log = cell.log_path.read_text()
    assert "checkpoint written; continue with --resume" in log and "resuming from step" in log
    ran, ref = cell.run_dir, reference / "tiny" / "seed0"
    assert _transcript(ran) == _transcript(ref)
    a, b = (load_file(str(d / "selected.safetensors")) for d in (ran, ref))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
