"""Live monitoring (``report_to``): TensorBoard event files read back, the W&B adapter (a stand-in module, and
W&B's own offline mode where installed), the one-line errors, and ``curves.png`` at the end of a run."""
import glob
import json
import types

import pytest

from paczero.cli import main
from paczero.config import ConfigError, TrainConfig
from paczero.train import train
from paczero.run.trackers import WandbTracker, check_report_to

TINY = dict(model="tiny-llama", task="demo", n_train=16, n_dev=8, n_test=8, steps=4, eval_every=2,
            checkpoint_every=2, num_subsets=4, private_seed=3, progress=False, eval_zero_shot=False)
PNG = b"\x89PNG\r\n\x1a\n"


def _quiet(*a, **k):
    pass


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_report_to_takes_three_values_and_names_them(capsys):
    with pytest.raises(ConfigError, match="report_to must be one of none, tensorboard, wandb, got 'mlflow'"):
        TrainConfig(report_to="mlflow").validate()
    assert main(["train", "--report-to", "mlflow", "--model", "tiny-opt"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "report_to must be one of" in err


def test_a_missing_tracker_library_is_one_line_before_any_model_loads(tmp_path, monkeypatch):
    """Red if the check were dropped (the run would start, create its folder and fail at the import) or came
    after the model load (the folder would exist)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the wandb package.*pip install 'paczero\[wandb\]'"):
        check_report_to(TrainConfig(report_to="wandb"))
    check_report_to(TrainConfig(report_to="none"))  # control: none needs nothing
    with pytest.raises(ConfigError, match="needs the wandb package"):
        train(TrainConfig(**TINY, report_to="wandb", out_dir=str(tmp_path / "run")), log=_quiet)
    assert not (tmp_path / "run").exists()


def test_tensorboard_event_files_read_back_equal_the_public_logs(tmp_path):
    """The scalars TensorBoard holds are log.jsonl's, evals.jsonl's and summary.json's values, tag by tag, and
    nothing else: red if the tracker logged a value the run folder does not publish (the mechanism's secret
    index, its posterior, anything of its state_dict), or the config with the private seed. Also: the run
    ends with curves.png."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    summary = train(TrainConfig(**TINY, mechanism="pac-mi", mi_budget=0.05, report_to="tensorboard",
                                out_dir=str(run)), log=_quiet)
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()

    def series(tag):
        return [(e.step, e.value) for e in events.Scalars(tag)]

    log, evals = _jsonl(run / "log.jsonl"), _jsonl(run / "evals.jsonl")
    for tag, key in (("train/loss", "train_loss"), ("train/lr", "lr"), ("privacy/cum_mi", "cum_mi"),
                     ("release/unanimity", "unanimity"), ("release/agreement", "agreement")):
        assert series(tag) == [(r["step"] + 1, pytest.approx(r[key], rel=1e-6, abs=1e-9)) for r in log], tag
    assert log[-1]["cum_mi"] > 0  # the MI curve is not trivially zero
    assert series("dev/accuracy") == [(r["step"], pytest.approx(r["dev"]["accuracy"])) for r in evals]
    assert series("test/accuracy") == [(4, pytest.approx(summary["test"]["accuracy"]))]
    assert series("privacy/mi_bound") == [(4, pytest.approx(0.05))]
    public = {"train/loss", "train/lr", "privacy/cum_mi", "privacy/mi_step", "release/agreement", "release/unanimity",
              "release/free_frac", "time/seconds_per_step", "dev/loss", "dev/accuracy", "test/loss", "test/accuracy",
              "privacy/mi_bound", "privacy/mi_total_budget", "privacy/mi_spent", "privacy/mia_bound",
              "privacy/matched_dp_epsilon", "privacy/unanimity_rate", "selected_step"}
    assert set(events.Tags()["scalars"]) == public
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"mi_budget": 0.05' in config and "private_seed" not in config
    assert (run / "curves.png").read_bytes()[:8] == PNG


class _FakeRun:
    def __init__(self, **kwargs):
        self.init, self.logged, self.summary, self.exit_code = kwargs, [], {}, None

    def log(self, values, step):
        self.logged.append((step, dict(values)))

    def finish(self, exit_code=0):
        self.exit_code = exit_code


def _fake_wandb(runs):
    def init(**kwargs):
        runs.append(_FakeRun(**kwargs))
        return runs[-1]
    return types.SimpleNamespace(init=init)


def test_the_wandb_adapter_logs_the_public_records_and_resumes_the_same_run(tmp_path):
    """With a stand-in for the wandb module: the history is each step's public values at the step count, dev
    metrics at evaluations, the test metrics in the run's summary; the config sent lacks the private seed
    (red if public_config kept it); a resume continues the W&B run of the same id."""
    runs = []
    cfg = TrainConfig(**TINY, mechanism="pac-zpl", report_to="wandb", out_dir=str(tmp_path))
    tracker = WandbTracker(cfg, tmp_path, wandb=_fake_wandb(runs))
    record = {"step": 0, "train_loss": 0.7, "lr": 1e-3, "cum_mi": 0.0, "mi_step": 0.0, "agreement": 0.75,
              "unanimity": 0.0, "free_frac": 1.0, "seconds": 0.1, "bit": 1, "coef": 1.0, "y_tilde": None}
    tracker.step(record)
    tracker.evaluation(2, {"loss": 0.6, "accuracy": 0.625})
    tracker.close({"test": {"accuracy": 0.5}, "privacy": {"mi_bound": 0.0, "mia_bound": 0.5}, "selected_step": 2})
    run = runs[0]
    assert run.logged == [(1, {"train/loss": 0.7, "train/lr": 1e-3, "privacy/cum_mi": 0.0, "privacy/mi_step": 0.0,
                               "release/agreement": 0.75, "release/unanimity": 0.0, "release/free_frac": 1.0,
                               "time/seconds_per_step": 0.1}),
                          (2, {"dev/loss": 0.6, "dev/accuracy": 0.625})]
    assert run.summary == {"test/accuracy": 0.5, "privacy/mi_bound": 0.0, "privacy/mia_bound": 0.5,
                           "selected_step": 2}
    assert run.exit_code == 0 and run.init["dir"] == str(tmp_path) and run.init["project"] == "paczero"
    assert "private_seed" not in run.init["config"] and run.init["config"]["num_subsets"] == 4
    WandbTracker(cfg.replace(resume=True), tmp_path, wandb=_fake_wandb(runs))
    WandbTracker(cfg, tmp_path, wandb=_fake_wandb(runs))  # a fresh run: a new id
    assert runs[1].init["id"] == run.init["id"] and runs[2].init["id"] != run.init["id"]


def test_a_dp_runs_wandb_run_opens_at_the_end_without_console_or_system_metrics(tmp_path):
    """With a stand-in for the wandb module: a DP run's W&B run is opened only when the run ends (so W&B's own
    clock, ``_runtime``, and its folder's name say only when it ended), with console capture off and system
    metrics off, and receives the held values in one burst, each at its step. Red if it is opened at the start
    (W&B would time every step, and capture the console) or with W&B's default settings."""
    runs = []
    fake = types.SimpleNamespace(init=_fake_wandb(runs).init, Settings=lambda **kw: kw)
    cfg = TrainConfig(**TINY, mechanism="dpzero", epsilon=2.0, sample_rate=0.5,
                      report_to="wandb", out_dir=str(tmp_path))
    tracker = WandbTracker(cfg, tmp_path, wandb=fake)
    tracker.step({"step": 0, "train_loss": None, "lr": 1e-3, "free_frac": 0.0, "seconds": None})
    tracker.evaluation(2, {"loss": 0.6, "accuracy": 0.625})
    assert runs == []  # nothing on W&B's clock while the run trains
    tracker.close({"test": {"accuracy": 0.5}, "privacy": {"epsilon_rdp": 2.0}, "selected_step": 2})
    (run,) = runs
    assert run.init["settings"]["console"] == "off" and run.init["settings"]["x_disable_stats"] is True
    assert [step for step, _ in run.logged] == [1, 2] and run.logged[0][1] == {"train/lr": 1e-3,
                                                                               "release/free_frac": 0.0}
    assert run.summary["privacy/epsilon_rdp"] == 2.0 and run.exit_code == 0


@pytest.mark.slow
def test_wandb_offline_mode_writes_the_run_locally(tmp_path, monkeypatch):
    """W&B itself, offline: the run's W&B file under RUN/wandb/ holds the public tags (spawns W&B's service)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    train(TrainConfig(**TINY, mechanism="dpzero", epsilon=2.0, sample_rate=0.5, report_to="wandb",
                      out_dir=str(run)), log=_quiet)
    files = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    data = open(files[0], "rb").read()
    assert b"dev/accuracy" in data and b"privacy/epsilon" in data and b"test/accuracy" in data
    assert b"train/loss" not in data  # DP: the loss over a private batch is not published, so not tracked
