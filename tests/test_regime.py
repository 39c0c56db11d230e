"""The regime map (paczero/experiments/regime.py, `paczero regime`): the per-example scalars a run computes, stored and
resumed, and the share of unanimous directions for every (N, M) of a grid."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paczero.cli import main
from paczero.experiments.regime import SCALARS, read_scalars, unanimity_map

DEMO = Path(__file__).resolve().parents[1] / "paczero" / "data" / "demo_sentiment.jsonl"
TINY = ["--model", "tiny-llama", "--task", "sst2", "--data", str(DEMO), "--columns", "sentence=text",
        "--dtype", "fp32", "--n-train", "16", "--clip", "25"]


def test_the_scalars_are_those_a_run_computes_on_its_first_step(tmp_path):
    """MeZO's first release is the mean of the clipped per-example scalars of direction 0 of step 0 over the whole
    universe, computed by the training loop; the regime's direction 0 over the same universe (the run's data seed
    draws it) must give it to the last bit. Red if the regime evaluated other directions than a run draws (another
    step, seed or direction index), other examples, or another mu."""
    from paczero.config import TrainConfig
    from paczero.train import train

    cfg = TrainConfig(model="tiny-llama", task="sst2", data=str(DEMO), columns={"sentence": "text"}, n_train=16,
                      n_dev=8, n_test=8, mechanism="mezo", steps=1, eval_every=1, dtype="fp32", clip=25,
                      data_seed=3, seed=5, progress=False, out_dir=str(tmp_path / "run"))
    train(cfg, log=lambda *a: None)
    coef = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])["coef"]
    assert main(["regime", str(tmp_path / "map"), *TINY, "--data-seed", "3", "--seed", "5", "--directions", "2",
                 "--n-grid", "8", "16", "--m-grid", "2", "4"]) == 0
    g, meta = read_scalars(tmp_path / "map")
    assert g.shape == (2, 16) and meta["weights"] == "base model" and meta["data_seed"] == 3
    assert float(np.clip(g[0], -25, 25).mean()) == coef
    assert not np.allclose(g[0], g[1])  # direction 1 is another direction


def test_an_interrupted_computation_resumes_and_other_settings_are_refused(tmp_path, capsys):
    """K = 2 then K = 3 in the same folder computes one more direction and gives what K = 3 at once gives; the
    folder alone redraws the map from its scalars; other settings (mu) are refused with one line, exit 2, and
    the stored scalars stay as they were. Red if a resume recomputed or overwrote stored directions."""
    once, twice = tmp_path / "once", tmp_path / "twice"
    grid = ["--n-grid", "8", "16", "--m-grid", "2", "4", "--draws", "3"]
    assert main(["regime", str(once), *TINY, "--directions", "3", *grid]) == 0
    assert main(["regime", str(twice), *TINY, "--directions", "2", *grid]) == 0
    capsys.readouterr()
    assert main(["regime", str(twice), *TINY, "--directions", "3", *grid]) == 0
    err = capsys.readouterr().err
    assert "direction 3/3" in err and "direction 1/3" not in err and "direction 2/3" not in err
    a, b = read_scalars(once)[0], read_scalars(twice)[0]
    assert np.array_equal(a, b)
    assert (twice / "regime.csv").read_text() == (once / "regime.csv").read_text()
    assert main(["regime", str(twice), "--m-grid", "4", "--directions", "2"]) == 0  # no forwards
    rows = (twice / "regime.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("16,4,2,20,")  # the default grid: N up to the universe's 16
    command = next(line for line in (twice / "regime.md").read_text().splitlines() if line.startswith("Command:"))
    assert "--model tiny-llama" in command and "--directions 2 --n-grid 16 --m-grid 4 --draws 20" in command
    before = (twice / SCALARS).read_bytes()
    assert main(["regime", str(twice), *TINY, "--mu", "1e-2", "--directions", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mu" in err[0] and "other settings" in err[0]
    assert (twice / SCALARS).read_bytes() == before


def test_a_moved_data_file_resumes_and_a_changed_one_is_refused(tmp_path, capsys):
    """The data file's place is not a setting: the same rows at another path continue the stored scalars; one
    row changed at the old path is refused with one line (the rows' digest differs). Red if the comparison
    went by path (the copy refused, or the changed file accepted)."""
    out = tmp_path / "map"
    first = tmp_path / "a.jsonl"
    first.write_bytes(DEMO.read_bytes())
    args = [*TINY[:4], "--columns", "sentence=text", "--dtype", "fp32", "--n-train", "16", "--clip", "25",
            "--n-grid", "16", "--m-grid", "2"]
    assert main(["regime", str(out), *args, "--data", str(first), "--directions", "1"]) == 0
    moved = tmp_path / "moved" / "b.jsonl"
    moved.parent.mkdir()
    first.rename(moved)
    capsys.readouterr()
    assert main(["regime", str(out), *args, "--data", str(moved), "--directions", "2"]) == 0
    assert "direction 2/2" in capsys.readouterr().err
    rows = moved.read_text().splitlines()
    changed = [json.loads(r) for r in rows]
    changed = [{**r, "text": r["text"] + " Indeed."} for r in changed]
    first.write_text("".join(json.dumps(r) + "\n" for r in changed))
    before = (out / SCALARS).read_bytes()
    assert main(["regime", str(out), *args, "--data", str(first), "--directions", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "examples_sha256" in err[0] and "other settings" in err[0]
    assert (out / SCALARS).read_bytes() == before


def test_a_finished_runs_released_weights_are_evaluated(tmp_path):
    """--run: the run's config and its selected.safetensors. The scalars equal those of the base model with the
    released weights loaded by hand, and differ from the base model's. Red if the weights were not loaded."""
    from safetensors.torch import load_file

    from paczero.run.build import build, load_trainable
    from paczero.config import TrainConfig
    from paczero.models import trainable_parameters
    from paczero.train import train
    from paczero.zo import Perturber, two_point_scalars

    cfg = TrainConfig(model="tiny-llama", task="sst2", data=str(DEMO), columns={"sentence": "text"}, n_train=16, mu=1e-3,
                      n_dev=8, n_test=8, mechanism="mezo", steps=3, lr=0.5, eval_every=3, dtype="fp32", clip=25,
                      progress=False, dev_best=False, out_dir=str(tmp_path / "run"))  # the final weights, not the base
    train(cfg, log=lambda *a: None)
    assert main(["regime", str(tmp_path / "trained"), "--run", str(tmp_path / "run"), "--n-train", "12",
                 "--directions", "1", "--n-grid", "12", "--m-grid", "2"]) == 0
    g, meta = read_scalars(tmp_path / "trained")
    assert meta["weights"].endswith("selected.safetensors") and g.shape == (1, 12)
    from paczero.experiments.regime import _universe

    probe = cfg.replace(n_train=12, out_dir=str(tmp_path / "probe"))
    examples = _universe(probe)
    setup = build(probe, examples=(examples, [], []))
    params = trainable_parameters(setup.model, "lora")
    base, _ = two_point_scalars(Perturber(setup.model, params, cfg.seed), 0, 1, cfg.mu,
                                setup.task.make_batches(setup.universe, token_budget=cfg.token_budget),
                                lambda b: setup.task.losses(setup.model, b), 12, "cpu")
    load_trainable(params, load_file(str(tmp_path / "run" / "selected.safetensors")))
    trained, _ = two_point_scalars(Perturber(setup.model, params, cfg.seed), 0, 1, cfg.mu,
                                   setup.task.make_batches(setup.universe, token_budget=cfg.token_budget),
                                   lambda b: setup.task.losses(setup.model, b), 12, "cpu")
    assert np.allclose(g, trained, rtol=0, atol=1e-9) and not np.allclose(g, base, rtol=0, atol=1e-6)


def test_unanimity_is_all_m_subset_signs_equal_after_the_clip():
    """Known answers. A direction whose scalars are all positive is unanimous for every N and M; one with a single
    outlier of -1000 among +1s never is (the outlier's M/2 subsets turn negative) unless the clip (25, as training
    applies it) tames it: then its subsets of N/2 examples stay positive when N/2 - 1 > 25, i.e. N >= 54, and turn
    negative below. Red if the clip is not applied, or unanimity is counted on a majority rather than all M signs."""
    universe = 64
    positive = np.full((1, universe), 1.0)
    outlier = positive.copy()
    outlier[0, 7] = -1000.0

    def share(g, clip):
        return {(r["n"], r["m"]): r for r in unanimity_map(g, [16, 64], [2, 8, 32], clip=clip, draws=10)}

    for clip in (None, 25.0):
        assert all(r["unanimous"] == 1.0 and r["agreement"] == 1.0 for r in share(positive, clip).values())
    raw, clipped = share(outlier, None), share(outlier, 25.0)
    for m in (2, 8, 32):
        assert raw[64, m]["unanimous"] == 0.0 and raw[64, m]["agreement"] == 0.5  # the outlier's M/2 subsets
        assert clipped[64, m]["unanimous"] == 1.0  # 31 - 25 > 0 in every subset of 32
        # N = 16: unanimous exactly on the draws that leave the outlier out, clipped or not (7 - 25 < 0)
        assert 0.0 < raw[16, m]["unanimous"] < 1.0 and clipped[16, m]["unanimous"] == raw[16, m]["unanimous"]


def test_bad_grids_and_settings_are_one_clear_error(tmp_path, capsys):
    for args in (["--m-grid", "3"], ["--n-grid", "1"], ["--n-grid", "17"], ["--draws", "0"],
                 ["--run", str(tmp_path), "--recipe", "quickstart/smollm2-demo-zpl-lora"]):
        assert main(["regime", str(tmp_path / "out"), *TINY, *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("paczero: error:"), err
    assert not (tmp_path / "out").exists()


def test_the_share_is_pac_zpls_unanimity_rate_on_the_same_signs(monkeypatch):
    """On Gaussian scalars whose subsets disagree on some directions and not on others, every draw's clipped
    scalars and design are handed to PAC-ZPL (paczero.mechanisms.pac, the release rule training uses): the map's
    share is the mean of the fraction of its releases on the unanimity branch. Red if the map counted a
    majority, or anything but all M signs equal, as unanimous."""
    import paczero.privacy.subsets as subsets
    from paczero.mechanisms.pac import PacZPL

    seen, original = [], subsets.subset_signs
    monkeypatch.setattr(subsets, "subset_signs", lambda g, d: seen.append((g.copy(), d.copy())) or original(g, d))
    rng = np.random.default_rng(1)
    g = rng.normal(0.0, 1.0, (40, 200)) + rng.normal(0.0, 0.25, (40, 1))  # each direction its own mean
    rows = unanimity_map(g, [50, 200], [4, 16], clip=2.0, draws=5)
    assert len(seen) == 4 * 5
    for i, r in enumerate(rows):
        rates = []
        for scalars, design in seen[5 * i:5 * i + 5]:
            mech = PacZPL(design.shape[0], design=design, secret=0, seed=0)
            rates.append(np.mean([rel.branch == "unanimous" for rel in mech.step(scalars)]))
        assert r["unanimous"] == pytest.approx(float(np.mean(rates)), abs=1e-12), r
    assert 0.0 < min(r["unanimous"] for r in rows) < max(r["unanimous"] for r in rows) < 1.0
