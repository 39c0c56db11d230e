"""Bad input never gives a traceback, a hang or a silent default.

The public privacy API raises ValueError on NaN, out-of-range, negative and
wrong-type arguments (a deadline catches hangs); the CLI answers bad config
values with exit code 2 and one line on stderr, before anything is built.
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paczero import privacy
from paczero.cli import main
from paczero.config import ConfigError, TrainConfig

FAST = settings(max_examples=40, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
NAN = float("nan")
wrong_type = st.sampled_from([None, "abc", "", [0.5], {"x": 1}, object(), b"\x00", (1, 2)])
not_a_probability = st.one_of(st.floats(max_value=-1e-9, allow_nan=False), st.floats(min_value=1 + 1e-9),
                              st.just(NAN))
negative = st.one_of(st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=True), st.just(NAN))
probability = st.floats(min_value=0.0, max_value=1.0)
open_probability = st.floats(min_value=1e-6, max_value=1 - 1e-6)
mi = st.floats(min_value=0.0, max_value=5.0)


# -------------------------------------------------------- privacy: valid input
@FAST
@given(q=probability, sigma=st.one_of(st.just(0.0), st.floats(min_value=1e-150, max_value=1e6)))
def test_binary_mi_in_range(q, sigma):
    v = privacy.binary_mi(q, sigma)
    assert 0.0 <= v <= privacy.binary_entropy(q) + 1e-12


@FAST
@given(m=mi)
def test_mia_bound_in_range_and_inverse(m):
    b = privacy.mia_bound(m)
    assert 0.5 <= b <= 1.0
    if b < 1.0:
        assert privacy.mi_for_mia(b) == pytest.approx(m, rel=1e-6, abs=1e-12)


def test_binary_mi_tiny_sigma():
    # found by hypothesis: sigma**2 underflowed below ~1e-154
    assert privacy.binary_mi(0.5, 3e-262) == pytest.approx(math.log(2))
    assert privacy.binary_mi(0.3, 1e-200) == privacy.binary_entropy(0.3)


def test_infinite_values_that_mean_something():
    assert privacy.mia_bound(math.inf) == 1.0
    assert privacy.dp_mia_bound(math.inf) == 1.0
    assert privacy.binary_mi(0.3, math.inf) == 0.0


# ------------------------------------------------------ privacy: invalid input
@FAST
@given(q=not_a_probability)
def test_probability_arguments_out_of_range(q):
    for call in (lambda: privacy.binary_entropy(q), lambda: privacy.binary_mi(q, 1.0),
                 lambda: privacy.sigma_for_mi(q, 0.01), lambda: privacy.binary_kl(q, 0.5),
                 lambda: privacy.binary_kl(0.5, q), lambda: privacy.mi_for_mia(q), lambda: privacy.mia_bound(0.1, q),
                 lambda: privacy.dp_mia_bound(1.0, 0.0, q)):
        with pytest.raises(ValueError):
            call()


@FAST
@given(x=negative)
def test_negative_or_nan_budgets(x):
    for call in (lambda: privacy.mia_bound(x), lambda: privacy.binary_mi(0.5, x), lambda: privacy.dp_mia_bound(x),
                 lambda: privacy.mi_matching_dp(x), lambda: privacy.dp_epsilon_matching_mi(x),
                 lambda: privacy.sigma_for_mi(0.5, x), lambda: privacy.dp_mia_bound(1.0, x)):
        with pytest.raises(ValueError):
            call()


@FAST
@given(q=open_probability, beta=st.one_of(st.floats(min_value=0.7), st.just(math.inf), st.just(0.0)))
def test_unachievable_sigma_targets(q, beta):
    with pytest.raises(ValueError):  # beta >= h(q) <= log 2 < 0.7, beta = 0 or inf
        privacy.sigma_for_mi(q, beta)


@FAST
@given(bad=wrong_type)
def test_wrong_types(bad):
    for call in (lambda: privacy.sigma_for_mi(bad, 0.01), lambda: privacy.sigma_for_mi(0.5, bad),
                 lambda: privacy.binary_kl(bad, 0.5), lambda: privacy.mia_bound(bad), lambda: privacy.mi_for_mia(bad),
                 lambda: privacy.dp_mia_bound(bad), lambda: privacy.mi_matching_dp(bad),
                 lambda: privacy.dp_epsilon_matching_mi(bad)):
        with pytest.raises(ValueError):
            call()


@FAST
@given(bad=wrong_type.filter(lambda v: not isinstance(v, (list, tuple))))
def test_wrong_types_vectorised(bad):
    # binary_entropy / binary_mi take arrays by design (lists and tuples are arrays). Open point: a dict or
    # an arbitrary object gives numpy's TypeError rather than a ValueError; either way it is an error.
    for call in (lambda: privacy.binary_entropy(bad), lambda: privacy.binary_mi(bad, 1.0),
                 lambda: privacy.binary_mi(0.5, bad)):
        with pytest.raises((ValueError, TypeError)):
            call()


# ------------------------------------------------------------ CLI and config
BAD_FLAGS = {
    "--lr": ["nan", "inf", "-1", "0", "abc"],
    "--steps": ["0", "-3", "1.5", "x"],
    "--num-subsets": ["3", "0", "-2", "7", "nan"],
    "--n-train": ["1", "0", "-5"],
    "--mu": ["0", "-1e-3", "nan", "inf"],
    "--weight-decay": ["-0.1", "nan", "inf"],
    "--clip": ["0", "-1", "nan", "inf"],
    "--eval-every": ["0", "-1"],
    "--checkpoint-every": ["0"],
    "--private-seed": ["-1", "1.5"],
    "--num-directions": ["0"],
    "--track": ["full", ""],
    "--dtype": ["fp64"],
    "--mechanism": ["pac", "PAC-ZPL"],
    "--task": ["mnist"],
    "--token-budget": ["8"],
}


@settings(max_examples=50, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(sorted(BAD_FLAGS)), data=st.data())
def test_cli_rejects_bad_values_in_one_line(flag, data, capsys, tmp_path):
    value = data.draw(st.sampled_from(BAD_FLAGS[flag]))
    argv = ["train", "--model", "tiny-llama", "--task", "demo", "--out-dir", str(tmp_path / "never"), flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("paczero: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "never").exists()


@FAST
@given(budget=st.one_of(st.sampled_from(["nan", "inf", "-0.1", "0", "abc"])),
       mech=st.sampled_from(["pac-mi", "hybrid"]))
def test_cli_rejects_bad_mi_budgets(budget, mech, capsys, tmp_path):
    argv = ["train", "--model", "tiny-llama", "--mechanism", mech, "--switch-step", "1", "--mi-budget", budget,
            "--out-dir", str(tmp_path / "never")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("paczero: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("text", ["lr: [1, 2\n", "- just\n- a list\n", "nonsense_key: 3\n", "lr: .nan\n",
                                  "steps: 2.5\n", "mechanism: 7\n", "mi_budget: -1\nmechanism: pac-mi\n"])
def test_config_files(tmp_path, capsys, text):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        TrainConfig.from_yaml(path).validate()
    assert main(["train", "--config", str(path), "--out-dir", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paczero: error: ") and err.count("\n") == 1, err


def test_missing_config_and_privacy_command(capsys, tmp_path):
    assert main(["train", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert main(["privacy", "--mi", "nan"]) == 2
    assert main(["privacy", "--mi", "-1"]) == 2
    assert main(["privacy", "--mia", "1.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("paczero: error: ") for line in err)


# ------------------------------------------------------ papercuts of the CLI
def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("paczero: error: ") and err.count("\n") == 1, err
    return err


def test_a_folder_as_config_is_one_line_with_a_hint(tmp_path, capsys):
    """--config DIR was an IsADirectoryError traceback; a run folder's hint is --resume."""
    assert main(["train", "--config", str(tmp_path), "--out-dir", str(tmp_path / "never")]) == 2
    assert "is a folder; give a YAML file" in _one_error_line(capsys)
    (tmp_path / "run.json").write_text("{}")
    assert main(["train", "--config", str(tmp_path), "--out-dir", str(tmp_path / "never")]) == 2
    assert f"--resume --out-dir '{tmp_path}'" in _one_error_line(capsys)
    assert not (tmp_path / "never").exists()


def test_an_unreachable_hub_dataset_is_one_line_with_a_hint(tmp_path, capsys, monkeypatch):
    """The hub's SST-2 offline was a ConnectionError traceback; now one line naming the dataset and --data."""
    import datasets

    def offline(path, *a, **k):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    import paczero.models

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(paczero.models, "hub_unreachable", lambda: None)  # the host answers; the request fails
    assert main(["train", "--model", "tiny-llama", "--task", "sst2", "--out-dir", str(tmp_path / "never")]) == 2
    err = _one_error_line(capsys)
    assert "cannot load the sst2 dataset (stanfordnlp/sst2)" in err and "Couldn't reach" in err and "--data" in err
    assert not (tmp_path / "never").exists()


def test_a_hub_dataset_with_no_route_to_the_hub_reads_the_cache_only(tmp_path, capsys, monkeypatch):
    """With no route to the hub, SST-2 is loaded in offline mode (a cached copy loads, anything else fails at
    once: datasets' requests would each retry for about 25 s), and the error names the unreachable host; the
    offline mode ends with the load. Red if the probe is skipped (load_dataset then runs online) or the
    offline mode outlives the call."""
    import socket

    import datasets
    import datasets.config
    from huggingface_hub import constants

    import paczero.models

    modes = []

    def load(path, *a, **k):
        modes.append((constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE))
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    def unreachable(address, *a, **k):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(datasets, "load_dataset", load)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(paczero.models, "_HUB_REACHED", set())
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert main(["train", "--model", "tiny-llama", "--task", "sst2", "--out-dir", str(tmp_path / "never")]) == 2
    err = _one_error_line(capsys)
    assert "the hub cannot be reached" in err and "Network is unreachable" in err and "--data" in err
    assert modes == [(True, True)] and constants.HF_HUB_OFFLINE is False and datasets.config.HF_HUB_OFFLINE is False


def test_an_unreachable_hub_model_is_one_line_at_once(tmp_path, capsys, monkeypatch):
    """A hub model name with no route to the hub gave about 50 s of huggingface_hub's retry warnings before the
    error; now one line at once, before any folder is made. The probe is skipped for a cached model, in offline
    mode and behind a proxy. Red if the probe is removed (the error then names the tokenizer, after the retries)
    or runs where it must not (a cached model, a proxy)."""
    import socket

    import huggingface_hub
    from huggingface_hub import constants

    import paczero.models

    calls = []

    def unreachable(address, *a, **k):
        calls.append(address)
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(paczero.models, "_HUB_REACHED", set())
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert main(["train", "--model", "someorg/some-model", "--out-dir", str(tmp_path / "never")]) == 2
    err = _one_error_line(capsys)
    assert "cannot reach the Hugging Face hub" in err and "Network is unreachable" in err
    assert "'someorg/some-model'" in err
    assert not (tmp_path / "never").exists() and len(calls) == 1

    from paczero.models import check_hub_reachable

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    check_hub_reachable("someorg/some-model")
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: f"/cache/{repo}/{name}")
    check_hub_reachable("someorg/some-model")
    assert len(calls) == 1


@pytest.mark.parametrize("typed,meant", [("tiny-lama", "tiny-llama"), ("smolm2", "smollm2"),
                                         ("smollm2-135m-instrct", "smollm2-135m-instruct")])
def test_a_mistyped_built_in_model_name_gets_a_did_you_mean(tmp_path, capsys, monkeypatch, typed, meant):
    """A name close to a built-in model's (no owner/ part) is refused in one line that names the built-in
    name, before the hub is probed and before any folder is made; a hub id without an owner ('gpt2') is not
    taken for a typo. Red if the check is removed (the error is then the hub probe's) or matches loosely."""
    import paczero.models

    probed = []
    monkeypatch.setattr(paczero.models, "check_hub_reachable", probed.append)
    assert main(["train", "--model", typed, "--out-dir", str(tmp_path / "never")]) == 2
    err = _one_error_line(capsys)
    assert f"did you mean {meant!r}" in err and not probed and not (tmp_path / "never").exists()
    paczero.models.check_model_source("gpt2")
    assert probed == ["gpt2"]


def test_a_reachable_hub_is_probed_once_per_process(monkeypatch):
    """The run's checks, its data and its tokenizer each ask whether the hub is reachable: one connection
    answers them all, while a failed probe is asked again (the network may come back). Red if a success is
    not remembered (three connections) or a failure is (the second call does not raise)."""
    import socket

    from huggingface_hub import constants

    from paczero import models

    calls, up = [], [False]

    class _Conn:
        def close(self):
            pass

    def connect(address, *a, **k):
        calls.append(address)
        if not up[0]:
            raise OSError(101, "Network is unreachable")
        return _Conn()

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(models, "_HUB_REACHED", set())
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot reach the Hugging Face hub"):
            models.check_hub_reachable("someorg/some-model")
    up[0] = True
    for _ in range(3):
        models.check_hub_reachable("someorg/some-model")
    assert len(calls) == 3


def test_overwrite_and_resume_together_are_refused(tmp_path, capsys):
    assert main(["train", "--overwrite", "--resume", "--out-dir", str(tmp_path / "never")]) == 2
    assert "--overwrite" in _one_error_line(capsys)
    with pytest.raises(ConfigError, match="not both"):
        TrainConfig(overwrite=True, resume=True).validate()


def test_version_is_the_installed_one(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"paczero {version('paczero')}\n"


@pytest.mark.slow
def test_python_dash_m_paczero_is_the_command():
    import subprocess
    import sys
    from importlib.metadata import version

    done = subprocess.run([sys.executable, "-m", "paczero", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == f"paczero {version('paczero')}\n"
    done = subprocess.run([sys.executable, "-m", "paczero", "train", "--steps", "0"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("paczero: error: steps")


def _parsed(argv: list[str]):
    from paczero.cli import _build_parser
    from paczero.flags import config_from_args

    ns = _build_parser().parse_args(argv)
    return ns, (config_from_args(ns) if ns.command == "train" else None)


def test_list_flags_take_commas_and_spaces_alike(capsys):
    """--lora-targets q_proj,v_proj was one target named 'q_proj,v_proj' (peft then found no module)."""
    for argv in (["--lora-targets", "q_proj,v_proj"], ["--lora-targets", "q_proj", "v_proj"],
                 ["--lora-targets", "q_proj, v_proj"]):
        assert _parsed(["train", *argv])[1].lora_targets == ["q_proj", "v_proj"], argv
    assert TrainConfig.from_dict({"lora_targets": "q_proj,v_proj"}).lora_targets == ["q_proj", "v_proj"]
    assert _parsed(["sweep", "tiny", "--seeds", "0,1", "2"])[0].seeds == [0, 1, 2]
    if "rungs" in TrainConfig.field_names():
        assert _parsed(["train", "--steps", "4", "--rungs", "2,3", "4"])[1].rungs == [2, 3, 4]
    assert main(["train", "--lora-targets", "q_proj,,v_proj"]) == 2
    assert "empty item" in _one_error_line(capsys)
    with pytest.raises(ConfigError, match="lora_targets"):
        TrainConfig(lora_targets=["q_proj,v_proj"]).validate()


def test_escapes_in_a_template_flag_are_the_characters_they_name():
    r"""A shell passes --template 'Review: {sentence}\nSentiment:' with a backslash and an n."""
    cfg = _parsed(["train", "--template", "Review:\\t{sentence}\\nSentiment:"])[1]
    assert cfg.template == "Review:\t{sentence}\nSentiment:"
    assert _parsed(["train", "--template", "{sentence} C:\\\\new"])[1].template == "{sentence} C:\\new"
    assert _parsed(["train", "--template", "{sentence} It was"])[1].template == "{sentence} It was"
    ns = _parsed(["eval", "runs/x", "--template", "{sentence}\\nIt was"])[0]
    assert ns.template == "{sentence}\nIt was"


def test_every_flag_has_help_text_and_train_groups_them_by_topic(capsys, monkeypatch):
    """Each option of each sub-command (bench parses its own) says what it does; train's config flags
    come in the topics of TrainConfig's comments (model, task and data, mechanism, ...)."""
    import argparse

    from paczero.cli import _build_parser

    sub = next(a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    silent = [f"{name} {a.option_strings or a.dest}" for name, p in sub.choices.items() if name != "bench"
              for a in p._actions if not a.help or a.help == argparse.SUPPRESS]
    assert not silent, silent
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    heads = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert heads[-6:] == ["model", "task and data", "mechanism", "optimisation", "evaluation and selection",
                          "engineering"], heads
    at = [out.index(text) for text in ("\nmodel:", "\n  --lora-r", "\ntask and data:", "\n  --n-train", "\nmechanism:")]
    assert at == sorted(at)


def test_a_mistyped_flag_or_column_gets_a_hint(tmp_path, capsys):
    """One line with the closest flag for a mistyped one, and the --columns mapping for a file whose one
    unnamed field has one unused column. Red if the hint is missing or the error spans lines."""
    from paczero.cli import main

    assert main(["train", "--task", "sst2", "--n-trian", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean --n-trian -> --n-train?" in err
    path = tmp_path / "x.csv"
    path.write_text("review,label\nnice,1\nbad,0\nok,1\nmeh,0\n")
    assert main(["train", "--task", "sst2", "--data", str(path), "--n-train", "2", "--n-dev", "1", "--n-test", "1",
                 "--model", "tiny-llama", "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "map it with --columns sentence=review" in err


@pytest.mark.parametrize("sizes", [[], ["--n-train", "20", "--n-dev", "5", "--n-test", "5"]])
def test_a_label_the_verbalizer_does_not_score_is_refused_with_its_row_before_anything_loads(
        tmp_path, capsys, monkeypatch, sizes):
    """A 0/1 sentiment file whose 7th record has label 2: one line naming the file's record 7 and the labels
    the verbalizer scores, exit code 2, before any tokenizer or model loads and before the run folder is
    made, with the sizes as given or set. Red if the check waits for the tokenised task (the message then
    names the example's position in the sample, after the tokenizer loaded)."""
    import paczero.models

    loaded = []
    monkeypatch.setattr(paczero.models, "load_tokenizer", lambda *a, **k: loaded.append(a) or 1 / 0)
    monkeypatch.setattr(paczero.models, "load_model", lambda *a, **k: loaded.append(a) or 1 / 0)
    rows = [f"review number {i},{2 if i == 6 else i % 2}" for i in range(40)]
    (tmp_path / "reviews.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "never"
    assert main(["train", "--task", "sst2", "--data", str(tmp_path / "reviews.csv"), "--columns", "sentence=text",
                 "--model", "tiny-llama", "--out-dir", str(out), *sizes]) == 2
    err = _one_error_line(capsys)
    assert "reviews.csv record 7: label 2 is not one of the labels the verbalizer scores (0, 1)" in err, err
    assert not loaded and not out.exists()


def test_a_flag_is_named_whole_and_a_short_model_name_is_named_in_full(tmp_path, capsys, caplog):
    """`--num-subset` (a prefix of --num-subsets) is refused in one line that names the flag meant, not
    taken for it; `smollm2-135m` is the offline Instruct model, and one warning line says so (once). Red if
    argparse's prefix matching is on, or if the short name maps silently."""
    import logging

    import paczero.models

    assert main(["train", "--num-subset", "8", "--print-config"]) == 2
    err = _one_error_line(capsys)
    assert "unrecognized arguments: --num-subset 8" in err and "--num-subsets" in err
    paczero.models._ALIASES_NAMED.discard("smollm2-135m")
    with caplog.at_level(logging.WARNING, logger="paczero"):
        paczero.models.check_model_source("smollm2-135m")
        paczero.models.check_model_source("smollm2-135m")
    said = [r.getMessage() for r in caplog.records if "smollm2-135m" in r.getMessage()]
    assert said == ["model 'smollm2-135m' is 'smollm2-135m-instruct', the Instruct model (paczero's offline copy); "
                    "the base model SmolLM2-135M is the hub's HuggingFaceTB/SmolLM2-135M"]


def test_eval_of_a_file_names_its_fix_the_delimiter_and_the_user_s_column(tmp_path, capsys, monkeypatch):
    """`paczero eval --data FILE` of a file whose columns are not the task's: one line with the --columns hint
    (as train gives it), before any model loads; a semicolon-separated CSV (its header one column
    `review;sentiment`): one line about the delimiter; an empty review cell: one line naming the file's column
    `review` and the row, not the task's field. Exit code 2 each. Red if a hint is missing or the message says
    `sentence`."""
    import paczero.models

    monkeypatch.setattr(paczero.models, "load_model", lambda *a, **k: 1 / 0)
    files = {"named.csv": "review,sentiment\n" + "".join(f"row {i},{i % 2}\n" for i in range(8)),
             "semi.csv": "review;sentiment\n" + "".join(f"row {i};{i % 2}\n" for i in range(8)),
             "empty.csv": "review,sentiment\n" + "".join(f"{'' if i == 6 else f'row {i}'},{i % 2}\n" for i in range(8))}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    base = ["eval", "tiny-llama", "--task", "sst2", "--data"]
    assert main(base + [str(tmp_path / "named.csv")]) == 2
    err = _one_error_line(capsys)
    assert "lacks column(s) ['sentence', 'label']" in err and "--columns sentence=COLUMN,label=COLUMN" in err, err
    assert main(base + [str(tmp_path / "semi.csv")]) == 2
    err = _one_error_line(capsys)
    assert "one column, 'review;sentiment'" in err and "separated by semicolons" in err, err
    assert main(base + [str(tmp_path / "empty.csv"), "--columns", "sentence=review,label=sentiment"]) == 2
    err = _one_error_line(capsys)
    assert "empty.csv record 7: review is missing or empty" in err and "sentence" not in err, err


def test_eval_of_a_run_on_another_file_with_its_columns_needs_no_columns(tmp_path, capsys):
    """A run trained with --columns sentence=review,label=sentiment, evaluated with --data on another file of the
    same columns and no --columns: the run's mapping applies (no error). Red if eval forgets the run's
    mapping for a file that has its columns."""
    rows = "review,sentiment\n" + "".join(f"row number {i},{i % 2}\n" for i in range(30))
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "heldout.csv").write_text(rows)
    assert main(["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(tmp_path / "train.csv"), "--columns",
                 "sentence=review,label=sentiment", "--steps", "1", "--num-subsets", "4", "--no-progress",
                 "--no-eval-zero-shot", "--out-dir", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "heldout.csv")]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 30


@pytest.mark.parametrize("labels,sizes", [(["--labels", "billing,technical,account", "--template", "auto"], []),
                                          ([], ["--n-train", "20", "--n-dev", "5", "--n-test", "5"])])
def test_a_training_file_of_one_class_is_refused_before_anything_loads(tmp_path, capsys, monkeypatch, labels, sizes):
    """A file whose rows all hold one label (`billing` by name, or 1): one line naming the file and the label,
    exit code 2, before any tokenizer or model loads and before the run folder is made; the same file is
    still a file paczero eval may score whole (no training rows). Red if the check is dropped (the run
    trains and releases a model of one class) or if it also refuses evaluation files."""
    import paczero.models
    from paczero.tasks import load_splits

    loaded = []
    monkeypatch.setattr(paczero.models, "load_tokenizer", lambda *a, **k: loaded.append(a) or 1 / 0)
    monkeypatch.setattr(paczero.models, "load_model", lambda *a, **k: loaded.append(a) or 1 / 0)
    label = "billing" if labels else "1"
    path = tmp_path / "tickets.csv"
    path.write_text("text,label\n" + "".join(f"\"ticket {i}, please help\",{label}\n" for i in range(40)))
    out = tmp_path / "never"
    assert main(["train", "--task", "sst2", "--data", str(path), "--columns", "sentence=text", "--model", "tiny-llama",
                 "--out-dir", str(out), *labels, *sizes]) == 2
    err = _one_error_line(capsys)
    said = "'billing'" if labels else "1"
    assert f"tickets.csv: every training row has label {said}, one class" in err and "two classes" in err, err
    assert not loaded and not out.exists()
    names = labels[1].split(",") if labels else None
    assert len(load_splits("sst2", source=str(path), n_train=0, n_dev=0, n_test=40, columns={"sentence": "text"},
                           labels=names)[2]) == 40


@pytest.mark.parametrize("mark,name", [(";", "semicolons"), ("\t", "tabs")])
def test_a_csv_of_another_delimiter_gets_the_delimiter_hint_before_the_comma_check(tmp_path, capsys, mark, name):
    """A .csv file separated by semicolons (or tabs) whose messages hold commas: the rows have more comma fields
    than the one-column header, and the one line names the delimiter, not an unquoted comma. Red if the
    'more fields than the header' check runs first."""
    path = tmp_path / "tickets.csv"
    path.write_text(f"text{mark}label\n" + "".join(f"hello, my bill {i}{mark}billing\n" for i in range(10)))
    assert main(["train", "--task", "sst2", "--data", str(path), "--model", "tiny-llama",
                 "--out-dir", str(tmp_path / "never")]) == 2
    err = _one_error_line(capsys)
    assert f"separated by {name}" in err and "more fields" not in err, err


@pytest.mark.parametrize("typed,meant", [("--learning-rate", "--lr"), ("--lr-rate", "--lr"), ("--epochs", "--steps"),
                                         ("--output-dir", "--out-dir"), ("--max-steps", "--steps")])
def test_a_flag_of_another_tool_points_at_paczero_s(typed, meant, capsys):
    """`--learning-rate 1e-3` (and other tools' names for paczero's flags) is refused by the parser in one line,
    exit code 2, that names the flag meant. Red if the alias table is dropped (difflib finds no flag close to
    --learning-rate) or maps to a flag train does not have."""
    assert main(["train", f"{typed}=3", "--print-config"]) == 2
    err = _one_error_line(capsys)
    assert f"did you mean {typed} -> {meant}" in err, err


@pytest.mark.parametrize("value", ["abc", "1e-3,x", "auto2"])
def test_a_bad_lr_says_what_lr_accepts(value, capsys, tmp_path):
    """`--lr abc` (or a comma list with a word in it) is one line, exit 2, that says what --lr takes: a number, a
    comma list of numbers, or auto, and repeats what was typed. Red if the line is argparse's own "invalid
    parse_lr value" (the function's name, not the flag's values)."""
    argv = ["train", "--model", "tiny-llama", "--task", "demo", "--out-dir", str(tmp_path / "never"), "--lr", value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "parse_lr" not in err, err
    assert "--lr" in err and "a number" in err and "comma" in err and "auto" in err and repr(value) in err, err


def _questions(path, n=100):
    path.write_text("text,label\n" + "".join(f"\"question {i} about {'cats' if i % 2 else 'dogs'}\",{i % 2}\n"
                                             for i in range(n)))
    return path


@pytest.mark.parametrize("given,sizes", [(["--n-train", "40"], [40, 16, 20]), (["--n-dev", "30"], [50, 30, 20]),
                                         (["--n-train", "30", "--n-test", "50"], [30, 10, 50]),
                                         (["--n-train", "75"], [75, 5, 20])])
def test_one_size_given_keeps_the_others_sized_from_the_file(tmp_path, capsys, given, sizes):
    """On a 100-row file too small for the default sizes, the sizes not given are sized from the file as when
    none is given (a fifth of the rows for test, a fifth of the rest for dev, the rest for U, where those fit
    beside the given ones) and the given ones are kept: --n-train 40 gives dev 16 and test 20, not the default
    dev of 500. Red if one size given brings back the defaults for the others ("fewer than n_train+n_dev=40+500")."""
    data = _questions(tmp_path / "q.csv")
    argv = ["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(data), *given, "--print-config"]
    assert main(argv) == 0, capsys.readouterr().err
    config = json.loads(capsys.readouterr().out)
    assert [config[k] for k in ("n_train", "n_dev", "n_test")] == sizes


def test_a_dp_run_takes_no_size_from_its_file_when_one_size_is_given(tmp_path, capsys):
    """A DP run with one or two sizes given is sized by its settings alone: without --n-test it is refused in one
    line (its sizes are public), and with --n-train and --n-test its dev stays the default, whatever the file
    holds. Red if a DP run takes an unset size from the file's row count."""
    data = _questions(tmp_path / "q.csv")
    base = ["train", "--model", "tiny-llama", "--task", "sst2", "--data", str(data), "--mechanism", "dp-sgd",
            "--epsilon", "2"]
    assert main(base + ["--n-train", "40"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes no sample size from its data" in err, err
    assert main(base + ["--n-train", "40", "--n-test", "20", "--print-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert [config[k] for k in ("n_train", "n_dev", "n_test")] == [40, TrainConfig().n_dev, 20]
