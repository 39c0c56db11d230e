"""The shipped recipes: every one is a valid TrainConfig, and the values match the paper's tables."""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from paczero.recipes import list_recipes, resolve_recipe
from paczero.config import TrainConfig, load_yaml

REPO = Path(__file__).resolve().parents[1]
ALL = list_recipes()
NAMES = [n for n in ALL if not n.startswith(("quickstart/", "cpu-scale/", "cpu-tuned/", "cpu-regime/",
                                              "cpu-practitioner/", "cpu-sst2/", "gpu-sst2/", "cpu-agnews/",
                                              "cpu-sst5/"))]  # the paper's
CPU = [n for n in ALL if n.startswith("cpu-scale/")]  # the CPU-scale table (its data file is not shipped)
TUNED = [n for n in ALL if n.startswith("cpu-tuned/")]  # the tuned CPU table (data and ood files not shipped)
REGIME = [n for n in ALL if n.startswith("cpu-regime/")]  # the tuned table at M = 128 (the same files)
PRACTITIONER = [n for n in ALL if n.startswith("cpu-practitioner/")]  # from the strong prompt (the same files)
SST2 = [n for n in ALL if n.startswith(("cpu-sst2/", "gpu-sst2/"))]  # SST-2 from the strong prompt (file not shipped)
WEAK = [n for n in ALL if n.startswith(("cpu-agnews/", "cpu-sst5/"))]  # several classes from a weak start (not shipped)
DEMO_FILE = REPO / "paczero" / "data" / "demo_sentiment.jsonl"  # a file with the "text" and "label" columns


def cfg(name: str) -> TrainConfig:
    return TrainConfig.from_dict(load_yaml(resolve_recipe(name)), source=name)


def paper(name: str) -> dict:
    return yaml.safe_load(resolve_recipe(name).read_text())["paper"]


def test_every_table_is_shipped():
    tables = {n.split("/")[0] for n in NAMES}
    assert {"headline", "plateau", "plateau-lora", "dp-cliff", "k-ablation", "ablation", "zpl-ladder",
            "zpl-canonical", "zpl-lr-sweep", "clip-ablation", "rank-ablation"} <= tables
    count = lambda t: sum(n.startswith(t + "/") for n in NAMES)
    assert count("headline") == 24 and count("plateau") == 15 and count("plateau-lora") == 15
    assert count("dp-cliff") == 12 and count("k-ablation") == 8 and count("ablation") == 10


@pytest.mark.parametrize("name", NAMES)
def test_recipe_validates(name):
    c = cfg(name).validate()
    block = yaml.safe_load(resolve_recipe(name).read_text())
    assert block["recipe"]["name"] == name
    assert isinstance(block["paper"].get("reported_test"), float) or block["paper"]["note"]  # a figure or why none
    assert block["recipe"]["seed_field"] == "data_seed"  # a paper seed draws the data (the scripts' train_set_seed)
    assert c.select_metric == ("loss" if c.task == "sst2" else "f1")  # the scripts' metric_for_best_model
    assert c.n_train == 1000 and c.n_dev == 500 and c.mu == 1e-3 and c.weight_decay == 0.0
    assert c.model in ("facebook/opt-1.3b", "facebook/opt-6.7b") and c.task in ("sst2", "squad")
    assert c.private_seed is None  # the secret comes from OS entropy
    assert c.coin_step == "move"  # Algorithm 1: a coin release moves the weights along the coin


@pytest.mark.parametrize("name", [n for n in ALL if n.startswith("quickstart/")])
def test_quickstart_recipes_validate(name):
    """The quick start validates, and names its dev-best metric: the README's quick-start figures were selected by
    dev accuracy. Red if the recipe leaves select_metric to the default (the dev loss)."""
    c = cfg(name).validate()
    assert c.model == "smollm2-135m-instruct" and c.task == "demo" and c.private_seed is None
    assert c.select_metric == "accuracy"


def test_headline_values_match_tab_headline_recipes():
    c = cfg("headline/sst2-opt1.3b-ft-zpl")
    assert (c.mechanism, c.lr, c.clip, c.steps, c.num_subsets, c.track) == ("pac-zpl", 1e-4, 1000, 1000, 126, "ft")
    p = paper("headline/sst2-opt1.3b-ft-zpl")
    assert (p["reported_test"], p["std"], p["n"]) == (88.99, 0.91, 3)
    c = cfg("headline/sst2-opt1.3b-lora-mi0.33")
    assert (c.mechanism, c.mi_budget, c.lr, c.clip, c.steps, c.num_subsets) == ("pac-mi", 0.33, 5e-4, 25, 2000, 128)
    c = cfg("headline/sst2-opt6.7b-lora-zpl")
    assert (c.lr, c.clip, c.steps, c.model) == (1e-3, 10, 1000, "facebook/opt-6.7b")
    c = cfg("headline/squad-opt6.7b-lora-mi0.68")
    assert (c.task, c.lr, c.clip, c.steps, c.mi_budget) == ("squad", 1e-3, 10, 1000, 0.68)  # SQuAD LoRA: T=1000
    assert paper("headline/squad-opt1.3b-ft-zpl")["per_seed_test"] == [62.36, 63.53, 60.87]


def test_seed_lists_are_the_per_seed_tables():
    """The seeds a recipe sweeps are the paper's (its per-seed tables and the authors' scripts), n of them."""
    seeds = {n: yaml.safe_load(resolve_recipe(n).read_text())["recipe"]["seeds"] for n in NAMES}
    assert seeds["headline/sst2-opt1.3b-lora-zpl"] == [1, 2, 3]
    assert seeds["headline/sst2-opt6.7b-ft-mi0.33"] == [0, 1, 2, 42]
    assert seeds["headline/sst2-opt1.3b-ft-mi0.33"] == [0, 1, 2, 3] and seeds["zpl-canonical/sst2-opt1.3b-ft"] == [1, 2, 3]
    for n in NAMES:
        assert len(seeds[n]) == paper(n)["n"], n


def test_per_seed_values_reproduce_the_papers_mean_and_std():
    import statistics

    for name in NAMES:
        p = paper(name)
        seeds = p.get("per_seed_test")
        if seeds and len(seeds) == p["n"]:
            assert round(statistics.mean(seeds), 2) == pytest.approx(p["reported_test"], abs=0.011), name
            assert round(statistics.stdev(seeds), 2) == pytest.approx(p["std"], abs=0.011), name


def test_plateau_dp_and_ablation_values():
    mis = sorted(cfg(n).mi_budget for n in NAMES if n.startswith("plateau/"))
    assert mis == [1e-4, 3e-4, 5e-4, 1e-3, 2e-3, 3e-3, 1e-2, 3e-2, 5e-2, 0.07, 0.11, 0.2, 0.33, 0.5, 0.68]
    for n in NAMES:
        if n.startswith("plateau/"):
            c = cfg(n)
            assert (c.track, c.steps, c.lr, c.clip, c.num_subsets) == ("ft", 1000, 1e-4, 1000, 128)
        if n.startswith("plateau-lora/"):
            c = cfg(n)
            assert (c.track, c.steps, c.lr, c.clip) == ("lora", 2000, 5e-4, 25)
    c = cfg("dp-cliff/sst2-opt1.3b-ft-dpzero-k1-eps0.5")  # the paper's DPZero: the DP-AggZO code at K = 1
    assert (c.mechanism, c.num_directions, c.steps, c.lr, c.dp_clip, c.sample_rate, c.epsilon, c.delta) == \
        ("dpzero-aggzo1", 1, 20000, 5e-6, 25.0, 0.064, 0.5, 1e-5)
    c = cfg("dp-cliff/sst2-opt1.3b-ft-dp-aggzo-k64-eps6")  # the appendix's parity cell
    assert (c.mechanism, c.num_directions, c.steps, c.epsilon) == ("dp-aggzo", 64, 1000, 6.0)
    for n in NAMES:  # the scripts' --eval_steps: 200 for run_dpaggzo and run_kvar, 100 for the PAC cells
        assert cfg(n).eval_every == (200 if n.startswith(("dp-cliff/", "k-ablation/")) else 100), n
    c = cfg("dp-cliff/sst2-opt1.3b-ft-dp-aggzo-k64-eps2")
    assert (c.mechanism, c.num_directions, c.steps, c.epsilon) == ("dp-aggzo", 64, 1000, 2.0)
    assert paper("dp-cliff/sst2-opt1.3b-ft-dp-aggzo-k64-eps2")["reported_test"] == 88.42
    c = cfg("ablation/sst2-opt1.3b-lora-mi0.001-uniform-t2000")
    assert (c.schedule, c.mi_budget, c.steps) == ("uniform", 0.001, 2000)
    assert cfg("ablation/sst2-opt1.3b-lora-random-sign-t2000").mechanism == "random_sign"
    assert cfg("zpl-ladder/sst2-opt1.3b-ft").clip is None  # no-clip
    assert cfg("k-ablation/sst2-opt6.7b-ft-mi0.33-k16").num_directions == 16
    assert cfg("rank-ablation/sst2-opt6.7b-lora-r16").lora_r == 16


def test_every_squad_cell_trains_on_generation_f1_as_the_scripts():
    """The scripts pass --non_diff to every SQuAD cell: minus the F1 of a greedy generation of at most 50 tokens,
    ended at the newline token or EOS, prompts fitting 2048 tokens (run_paczo.py's defaults)."""
    squad = [n for n in NAMES if cfg(n).task == "squad"]
    assert len(squad) == 12
    for n in squad:
        c = cfg(n)
        assert (c.objective, c.max_new_tokens, c.max_length, c.answer_stop) == ("f1", 50, 2048, "newline-token"), n
        assert "objective f1" in resolve_recipe(n).read_text().split("recipe:")[0], n  # said in the header


def test_ladders_are_one_trajectory_with_rungs():
    """Each T-ladder is one recipe whose run evaluates its rungs along one trajectory (steps = the last rung); the
    paper's figure at each rung is in the recipe and in paper_results.csv."""
    ladders = {"zpl-ladder/sst2-opt1.3b-ft": [1000, 2000, 3000, 4000, 5000],
               "zpl-ladder/sst2-opt6.7b-lora": [500, 1000, 1500], "zpl-ladder/sst2-opt6.7b-ft": [500, 1000, 1500],
               "zpl-canonical/sst2-opt6.7b-lora": [500, 1000, 1500], "zpl-canonical/sst2-opt6.7b-ft": [500, 1000, 1500]}
    assert {n for n in NAMES if cfg(n).rungs} == set(ladders)
    for n, rungs in ladders.items():
        c = cfg(n)
        assert c.rungs == rungs and c.steps == rungs[-1] and not c.dev_best, n
    assert [n for n in NAMES if n.startswith("zpl-ladder/")] == sorted(n for n in ladders if n.startswith("zpl-ladder/"))
    assert paper("zpl-ladder/sst2-opt1.3b-ft")["rungs"][1000]["reported_test"] == 89.56  # tab:zpl-ft-ladder
    assert paper("zpl-ladder/sst2-opt6.7b-lora")["rungs"][500]["per_seed_test"] == [90.14, 87.16, 86.35]
    assert paper("zpl-canonical/sst2-opt6.7b-ft")["rung_statistic"] == "dev-best-rung"
    rows = list(csv.DictReader(open(resolve_recipe("zpl-ladder/sst2-opt1.3b-ft").parents[1] / "paper_results.csv")))
    rung_rows = {int(r["rung"]): float(r["reported_test"]) for r in rows
                 if r["recipe"] == "zpl-ladder/sst2-opt6.7b-ft" and r["rung"]}
    assert rung_rows == {500: 90.37, 1000: 89.33, 1500: 88.76}  # tab:zpl-67b-ft-ladder


def test_recipes_are_generated_and_current():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "make_recipes.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_paper_results_data_file():
    rows = list(csv.DictReader(open(resolve_recipe("headline/sst2-opt1.3b-ft-zpl").parents[1] / "paper_results.csv")))
    by_recipe = {r["recipe"]: r for r in rows if r["recipe"]}
    assert set(by_recipe) == {n for n in NAMES if paper(n).get("reported_test") is not None}
    assert set(NAMES) - set(by_recipe) == {"dp-cliff/sst2-opt1.3b-ft-dp-aggzo-k64-eps6"}
    mezo = {r["model"]: float(r["reported_test"]) for r in rows if r["mechanism"] == "mezo"}
    assert mezo == {"facebook/opt-1.3b": 91.1, "facebook/opt-6.7b": 93.8}  # the FT ceilings of Section 5
    assert float(by_recipe["plateau/sst2-opt1.3b-ft-mi0.11"]["reported_test"]) == 89.56
    bao = [r for r in rows if not r["recipe"]]
    assert len(bao) == 18 and {r["mechanism"] for r in bao} == {"dpzero", "dp-aggzo", "mezo"}


@pytest.mark.slow  # about 10 s: every shipped recipe through the CLI twice
def test_every_recipe_round_trips_through_print_config(tmp_path, capsys):
    """``paczero train --recipe R --print-config`` writes JSON whose numbers PyYAML (YAML 1.1) reads as
    strings where they carry an exponent without a dot (``1e-05``, ``5e-06``); loaded back with --config it
    must give the identical config, for every shipped recipe (every mechanism among them). Red if numbers in
    text are not read as the float fields they fill."""
    from paczero.cli import main
    from paczero.config import MECHANISMS

    seen = set()
    for name in list_recipes():
        data = ["--data", str(DEMO_FILE)] if name in CPU + TUNED + REGIME + PRACTITIONER + SST2 + WEAK else []
        assert main(["train", "--recipe", name, "--print-config", *data]) == 0
        printed = capsys.readouterr().out
        path = tmp_path / "printed.yaml"
        path.write_text(printed)
        assert main(["train", "--config", str(path), "--print-config"]) == 0
        assert json.loads(capsys.readouterr().out) == json.loads(printed), name
        seen.add(json.loads(printed)["mechanism"])
    assert {"pac-zpl", "pac-mi", "dpzero-aggzo1", "dp-aggzo"} <= seen <= set(MECHANISMS)


def test_a_config_with_numbers_in_exponent_notation_loads(tmp_path):
    """A user's YAML as transformers/TRL write it (``lr: 5e-4``) gives floats, not strings."""
    path = tmp_path / "my.yaml"
    path.write_text("mechanism: dpzero\nepsilon: 2\ndelta: 1e-5\nsample_rate: 5e-1\nlr: 5e-4\nmu: 1e-3\n")
    cfg = TrainConfig.from_dict(load_yaml(path)).validate()
    assert (cfg.lr, cfg.mu, cfg.delta, cfg.sample_rate) == (5e-4, 1e-3, 1e-5, 0.5)


# ---------------------------------------------------------------------------- the CPU-scale table
def cpu_cfg(name: str, data: Path = DEMO_FILE) -> TrainConfig:
    return TrainConfig.from_dict({**load_yaml(resolve_recipe(name)), "data": str(data)}, source=name)


def test_cpu_scale_table_has_the_cells_of_its_issue():
    """Zero-shot (no cell: every run's base-model evaluation), MeZO, PAC-ZPL and PAC-MI 0.33 in LoRA and FT,
    PAC-MI 0.68 in LoRA, DPZero at epsilon 2 and 6, DP-AggZO at epsilon 2."""
    cells = {(c.mechanism, c.track, c.mi_budget, c.epsilon) for c in map(cpu_cfg, CPU)}
    assert cells == {("mezo", "lora", None, None), ("pac-zpl", "lora", None, None), ("pac-mi", "lora", 0.33, None),
                     ("pac-mi", "lora", 0.68, None), ("pac-zpl", "ft", None, None), ("pac-mi", "ft", 0.33, None),
                     ("dpzero-aggzo1", "lora", None, 2.0), ("dpzero-aggzo1", "lora", None, 6.0),
                     ("dp-aggzo", "lora", None, 2.0)}
    assert len(CPU) == 9


@pytest.mark.parametrize("name", CPU)
def test_cpu_scale_recipe_validates(name):
    c = cpu_cfg(name).validate()
    header = yaml.safe_load(resolve_recipe(name).read_text())["recipe"]
    assert header["name"] == name and header["seeds"] == [0, 1, 2] and header["seed_field"] == "data_seed"
    assert "imdb.jsonl" in header["requires_data"] and "CC BY 4.0" in header["requires_data"]
    assert "data" not in load_yaml(resolve_recipe(name))  # the file is given, never shipped or assumed
    assert (c.model, c.dtype, c.mu, c.task) == ("smollm2-135m-instruct", "bf16", 1e-2, "sst2")  # bf16 needs mu 1e-2
    assert c.template == "{sentence} It was" and c.verbalizer == {0: " terrible", 1: " great"}  # the paper's prompt
    assert c.columns == {"sentence": "text"} and c.eval_zero_shot and c.private_seed is None


def test_cpu_scale_shared_settings_are_identical_across_cells():
    """Every cell trains on the same universe size and is selected and tested on the same splits; the PAC cells
    share N, T, M and (per track) lr and clip; the DP cells the paper's dp_clip and delta, one sample rate."""
    cfgs = {n: cpu_cfg(n) for n in CPU}
    shared = ("model", "dtype", "mu", "task", "columns", "template", "verbalizer", "n_train", "n_dev", "n_test",
              "data_seed", "seed", "select_metric", "dev_best", "token_budget", "lora_r", "lora_alpha")
    for key in shared:
        assert len({json.dumps(getattr(c, key)) for c in cfgs.values()}) == 1, key
    c0 = next(iter(cfgs.values()))
    assert (c0.n_train, c0.n_dev, c0.n_test) == (64, 100, 500)
    for c in cfgs.values():  # dev-best chooses among 5 dev evaluations in every cell, at the same fractions of T
        assert c.steps % c.eval_every == 0 and c.steps // c.eval_every == 5, c.mechanism
    pac = [c for c in cfgs.values() if c.mechanism in ("pac-zpl", "pac-mi")]
    assert len(pac) == 5 and {(c.steps, c.num_subsets, c.num_directions) for c in pac} == {(100, 32, 1)}
    assert {(c.track, c.lr, c.clip, c.lr_schedule) for c in pac} == {("lora", 5e-3, 25, "polynomial"),
                                                                    ("ft", 5e-4, 1000, "polynomial")}
    mezo = cfgs["cpu-scale/smollm2-lora-mezo"]  # the non-private ceiling: PAC LoRA's data, N, T and lr
    assert (mezo.batch_size, mezo.steps, mezo.lr, mezo.clip) == (None, 100, 5e-3, 25)
    dp = [c for c in cfgs.values() if c.mechanism in ("dpzero-aggzo1", "dp-aggzo")]
    assert {(c.dp_clip, c.delta, c.sample_rate, c.lr, c.accountant, c.clip) for c in dp} == \
        {(25.0, 1e-5, 0.25, 2.5e-4, "rdp", None)}
    for c in dp:  # each DP cell scores as many expected example forwards as a PAC cell: T K 2qN = T_PAC 2N
        assert c.steps * c.num_directions * 2 * c.sample_rate * c.n_train == 100 * 2 * 64, c.mechanism


def test_cpu_scale_test_split_is_held_out_and_shared_by_the_cells_of_a_seed(tmp_path):
    """The loader draws test first from the file by the data seed, then the universe and dev from the rest: no
    cell trains or selects on a test example, and all cells of a seed see the same examples."""
    from paczero.tasks import load_splits

    path = tmp_path / "reviews.jsonl"
    path.write_text("".join(json.dumps({"text": f"review {i}", "label": i % 2}) + "\n" for i in range(1000)))
    tests = []
    for seed in (0, 1, 2):
        splits = set()
        for name in CPU:
            c = cpu_cfg(name, path)
            train, dev, test = load_splits(c.task, c.data, c.n_train, c.n_dev, c.n_test, seed, c.columns)
            ids = [tuple(e["sentence"] for e in part) for part in (train, dev, test)]
            assert not (set(ids[2]) & (set(ids[0]) | set(ids[1]))) and not set(ids[0]) & set(ids[1])
            assert list(map(len, ids)) == [64, 100, 500]
            splits.add(tuple(ids))
        assert len(splits) == 1  # every cell of the seed: the same universe, dev and test
        tests.append(set(splits.pop()[2]))
    assert tests[0] != tests[1] != tests[2]  # a data seed draws other examples


def test_cpu_scale_without_its_data_file_is_one_clear_error(tmp_path, capsys):
    """Red if the recipes ran without the file (the sweep would materialise the cells and train on the hub's
    SST-2, or fail late): the sweep and train each stop with one line naming the file and how to pass it."""
    from paczero.cli import main

    out_root = tmp_path / "runs"
    assert main(["sweep", "cpu-scale", "--seeds", "0", "--out-root", str(out_root), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--set data=PATH" in err[0] and "imdb.jsonl" in err[0], err
    assert not out_root.exists() or not any(out_root.rglob("seed0*"))
    assert main(["train", "--recipe", "cpu-scale/smollm2-lora-zpl", "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--data PATH" in err[0] and "imdb.jsonl" in err[0], err
    # given the file, every cell validates and its command sets the seed as data_seed
    assert main(["sweep", "cpu-scale", "--seeds", "0", "1", "2", "--out-root", str(out_root), "--dry-run",
                 "--set", f"data={DEMO_FILE}"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run ")]
    assert len(commands) == 27 and all("--data-seed" in c for c in commands)


def test_cpu_scale_budget_fits_four_hours():
    """The table's README states the budget arithmetic: 9 cells x 3 seeds within about 4 hours on 2 cores."""
    readme = (resolve_recipe(CPU[0]).parent / "README.md").read_text()
    hours = float(re.search(r"about \*\*([0-9.]+) hours\*\*", readme).group(1))
    assert hours <= 4.0
    minutes = [float(m) for m in re.findall(r"\| ([0-9.]+) \|$", readme, flags=re.M)]
    assert len(minutes) == 9 and abs(sum(minutes) * 3 / 60 - hours) < 0.1
    for name in CPU:  # each recipe's header names its own estimate, the one in the README
        cell = name.split("/")[1]
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{cell}` |"))
        assert f"about {row.rsplit('|', 2)[1].strip()} min per run" in resolve_recipe(name).read_text()


def test_cpu_tuned_table_grids_every_method_around_its_cpu_scale_value():
    """Each method of the tuned table is one cpu-scale cell (all else equal) at 4 learning rates spanning 10x
    that include the cpu-scale value; the PAC-ZPL cell with both coin rules, PAC-MI at 0.33 and 1e-3 nats
    (the plateau), DPZero at epsilon 0.5, 1, 2 (the cliff); every run measures the held-out attack.
    Red if a grid misses its family's cpu-scale lr, or a method's cells differ in more than lr."""
    by_method: dict[str, list] = {}
    for name in TUNED:
        method = re.sub(r"-lr[0-9.e-]+$", "", name.split("/")[1])
        by_method.setdefault(method, []).append(cpu_cfg(name).validate())
    assert set(by_method) == {"lora-mezo", "lora-zpl", "lora-zpl-skip", "lora-mi0.33-skip", "lora-mi0.001-skip",
                              "lora-mi0.33-pm", "lora-mi0.001-pm",
                              "lora-dpzero-eps0.5", "lora-dpzero-eps1", "lora-dpzero-eps2", "lora-dp-aggzo-k4-eps2"}
    base = {"lora-mezo": 5e-3, "lora-dp": 2.5e-4}
    for method, cfgs in by_method.items():
        lrs = sorted(c.lr for c in cfgs)[1:-1]  # the grid, between its two edges
        assert len(lrs) == 4 and lrs[-1] / lrs[0] == pytest.approx(10.0)
        assert (base["lora-dp"] if "dp" in method else base["lora-mezo"]) in lrs
        rest = {json.dumps({k: v for k, v in c.to_dict().items() if k != "lr"}, sort_keys=True) for c in cfgs}
        assert len(rest) == 1, method
        assert all(c.heldout_attack and c.n_train == 64 for c in cfgs)
    assert {c.coin_step for c in by_method["lora-zpl"]} == {"move"}
    assert {c.coin_step for c in by_method["lora-zpl-skip"]} == {"skip"}
    assert {c.epsilon for m in ("lora-dpzero-eps0.5", "lora-dpzero-eps1", "lora-dpzero-eps2")
            for c in by_method[m]} == {0.5, 1.0, 2.0}
    assert {c.mi_budget for m in ("lora-mi0.33-skip", "lora-mi0.001-skip") for c in by_method[m]} == {0.33, 1e-3}
    assert {c.noised_coef for m in ("lora-mi0.33-pm", "lora-mi0.001-pm") for c in by_method[m]} == {"posterior-mean"}


def test_cpu_regime_table_grids_every_method_around_its_cpu_tuned_choice():
    """The regime table: MeZO, PAC-ZPL with both coin rules, PAC-MI 1e-3 with the posterior mean and DPZero at
    epsilon 2, each at 5 learning rates (3 in the grid, an edge each side; DPZero two more beyond its upper edge)
    centred on its cpu-tuned choice on dev (docs/results/cpu-tuned.md: 5e-3, 1e-2, 2e-2, 1e-2, 2.5e-4); M = 128
    and N = 256 in fp32 at fp32's mu, 5 dev evaluations per run, DP matched to a PAC cell's expected example forwards; the README's estimate of every
    run is at most 20 minutes. Red if a grid is off its centre, a method's cells differ in more than lr, or a
    cell outgrows the budget."""
    by_method: dict[str, list] = {}
    for name in REGIME:
        method = re.sub(r"-lr[0-9.e-]+$", "", name.split("/")[1])
        by_method.setdefault(method, []).append(cpu_cfg(name).validate())
    centre = {"lora-mezo": 5e-3, "lora-zpl": 1e-2, "lora-zpl-skip": 2e-2, "lora-mi0.001-pm": 1e-2,
              "lora-dpzero-eps2": 2.5e-4}
    assert set(by_method) == set(centre)
    for method, cfgs in by_method.items():
        lrs = sorted(c.lr for c in cfgs)
        beyond = 2 if method == "lora-dpzero-eps2" else 0  # 2.5e-3 beyond 1e-3 (won on dev), 5e-3 beyond it
        assert len(lrs) == 5 + beyond and lrs[2] == centre[method], method
        rest = {json.dumps({k: v for k, v in c.to_dict().items() if k != "lr"}, sort_keys=True) for c in cfgs}
        assert len(rest) == 1, method
        c = cfgs[0]
        assert (c.dtype, c.mu, c.n_train, c.n_dev, c.n_test, c.heldout_attack) == ("fp32", 1e-3, 256, 100, 500, True)
        assert c.steps % c.eval_every == 0 and c.steps // c.eval_every == 5, method
        if c.mechanism in ("pac-zpl", "pac-mi"):
            assert c.num_subsets == 128 and c.clip == 25
    pac, dp = by_method["lora-zpl"][0], by_method["lora-dpzero-eps2"][0]
    assert dp.steps * 2 * dp.sample_rate * dp.n_train == pac.steps * 2 * pac.n_train and dp.epsilon == 2.0
    assert {c.coin_step for c in by_method["lora-zpl"]} == {"move"}
    assert {c.coin_step for c in by_method["lora-zpl-skip"]} == {"skip"}
    assert {(c.mi_budget, c.noised_coef) for c in by_method["lora-mi0.001-pm"]} == {(1e-3, "posterior-mean")}
    readme = (resolve_recipe(REGIME[0]).parent / "README.md").read_text()
    minutes = [float(m) for m in re.findall(r"\| ([0-9.]+) \|$", readme, flags=re.M)]
    assert len(minutes) == 5 and max(minutes) <= 20.0
    for name in REGIME:  # each recipe's header names its own estimate, the one in the README
        method = re.sub(r"-lr[0-9.e-]+$", "", name.split("/")[1])
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{method}-lr*` |"))
        assert f"about {row.rsplit('|', 2)[1].strip()} min per run" in resolve_recipe(name).read_text()


def test_every_recipe_holds_its_grid_row():
    """The recipe-protocol check reads the grid (paczero/recipes/grid.csv, the generator's input): every row is
    a shipped recipe whose config holds each value the row sets and whose seeds, title and paper figures are the
    row's; every shipped recipe but the quick start's has a row; a paper cell's source names its table and, where
    the authors' repository has one, the line of their script that runs it. Red if a recipe is edited by hand
    away from its row, or a row's recipe is missing."""
    rows = list(csv.DictReader((REPO / "paczero" / "recipes" / "grid.csv").open()))
    named = {f"{r['table']}/{r['cell']}" for r in rows}
    for table in ("cpu-practitioner", "cpu-sst2", "gpu-sst2", "cpu-agnews", "cpu-sst5"):  # grids as data of their own
        grid = yaml.safe_load((REPO / "scripts" / "recipe_templates" / f"{table}-grid.yaml").read_text())
        for method, m in grid["methods"].items():
            for lr in m["lrs"]:
                mantissa, exponent = f"{lr:e}".split("e")
                name = f"{table}/{method}-lr{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
                named.add(name)
                block = yaml.safe_load(resolve_recipe(name).read_text())
                assert {k: block[k] for k in m["config"]} == m["config"] and block["lr"] == lr, name
    assert named == {n for n in ALL if not n.startswith("quickstart/")}
    meta = {"table", "cell", "base", "seeds", "forwards", "method", "source", "title", "paper"}
    for r in rows:
        name = f"{r['table']}/{r['cell']}"
        block = yaml.safe_load(resolve_recipe(name).read_text())
        for key, value in r.items():
            if key not in meta and value != "":
                assert block[key] == json.loads(value), (name, key)
        assert block["recipe"]["seeds"] == [int(s) for s in r["seeds"].split()], name
        assert block["recipe"]["title"] == r["title"], name
        if r["paper"]:  # the paper's table and figures (rungs by T: numbers in YAML, strings in JSON)
            assert r["source"].startswith(("tab:", "app:"))
            figures = {"table": r["source"].split(";")[0], **json.loads(r["paper"])}
            assert json.loads(json.dumps(block["paper"])) == figures, name
            assert re.search(r"; authors' scripts/[\w/.-]+\.sh:\d+$", r["source"]) or name in (
                "ablation/sst2-opt1.3b-lora-mi0.001-uniform-t2000", "zpl-canonical/sst2-opt1.3b-ft"), name


def test_the_practitioner_table_starts_every_method_from_the_strong_prompt():
    """cpu-practitioner: MeZO, PAC-ZPL with both coin rules, PAC-MI 1e-3 with the posterior mean and DPZero at
    epsilon 2, each at 5 learning rates differing in nothing else, every cell from the strong prompt (the
    template and answer words on which the base model scores about 90 %), N = 256, M = 128, bf16 at bf16's mu,
    5 dev evaluations a run, DP matched to a PAC cell's example forwards. Red if a cell starts from the paper's
    prompt, a method's cells differ in more than lr, or DP gets more forwards than PAC."""
    by_method: dict[str, list] = {}
    for name in PRACTITIONER:
        method = re.sub(r"-lr[0-9.e-]+$", "", name.split("/")[1])
        by_method.setdefault(method, []).append(cpu_cfg(name).validate())
    assert set(by_method) == {"lora-mezo", "lora-zpl", "lora-zpl-skip", "lora-mi0.001-pm", "lora-dpzero-eps2",
                              "lora-dpsgd-eps2"}
    for method, cfgs in by_method.items():
        assert len(cfgs) == 5, method
        rest = {json.dumps({k: v for k, v in c.to_dict().items() if k != "lr"}, sort_keys=True) for c in cfgs}
        assert len(rest) == 1, method
        c = cfgs[0]
        assert c.template == "Review: {sentence}\nSentiment:" and c.verbalizer == {0: " negative", 1: " positive"}
        assert (c.n_train, c.n_dev, c.n_test, c.heldout_attack) == (256, 100, 500, True)
        assert (c.dtype, c.mu) == ("bf16", 1e-2) or (c.mechanism, c.dtype) == ("dp-sgd", "fp32")
        assert c.steps // c.eval_every == 5 and c.eval_zero_shot and c.dev_best, method
        if c.mechanism in ("pac-zpl", "pac-mi"):
            assert c.num_subsets == 128
    pac, dp = by_method["lora-zpl"][0], by_method["lora-dpzero-eps2"][0]
    assert dp.steps * 2 * dp.sample_rate * dp.n_train == pac.steps * 2 * pac.n_train and dp.epsilon == 2.0
    sgd = by_method["lora-dpsgd-eps2"][0]  # a forward and a backward (two forwards' work) per sampled example
    assert sgd.steps * sgd.sample_rate * sgd.n_train * 3 == pytest.approx(pac.steps * 2 * pac.n_train, rel=0.1)
    assert (sgd.epsilon, sgd.delta) == (dp.epsilon, dp.delta)


@pytest.mark.parametrize("table, n, steps", [("cpu-sst2", 128, 100), ("gpu-sst2", 1000, 1000)])
def test_the_sst2_tables_run_every_method_from_the_strong_prompt_on_the_papers_test_split(table, n, steps):
    """cpu-sst2 and gpu-sst2: PAC-ZPL (both coin rules), PAC-MI 1e-3, MeZO, DPZero at epsilon 2, DP-SGD at epsilon
    0.5, 1 and 2 and the non-private AdamW ceiling, each method's cells differing in lr only, every cell from the
    strong prompt, test = all 872 validation sentences, dev loss selecting, M = 128, a dev evaluation each tenth
    of the run (the budget curve). Red if a method or an epsilon is missing, a cell starts from the paper's
    prompt, the test split is sampled, or the ceiling clips or noises."""
    by_method: dict[str, list] = {}
    for name in [x for x in SST2 if x.startswith(table + "/")]:
        method = re.sub(r"-lr[0-9.e-]+$", "", name.split("/")[1])
        by_method.setdefault(method, []).append(cpu_cfg(name).validate())
    pac = {"lora-zpl-skip", "lora-zpl", "lora-mi0.001-pm"} if table == "gpu-sst2" else \
        {"lora-zpl-skip", "lora-zpl-skip-m16", "lora-zpl-m16", "lora-mi0.001-pm-m16", "lora-zpl-skip-m16-t400"}
    assert set(by_method) == pac | {"lora-mezo", "lora-dpzero-eps2", "lora-dpsgd-eps2", "lora-dpsgd-eps1",
                                    "lora-dpsgd-eps0.5", "lora-adamw"}
    for method, cfgs in by_method.items():
        rest = {json.dumps({k: v for k, v in c.to_dict().items() if k != "lr"}, sort_keys=True) for c in cfgs}
        assert len(rest) == 1, method
        c = cfgs[0]
        assert c.template == "Review: {sentence}\nSentiment:" and c.verbalizer == {0: " negative", 1: " positive"}
        assert (c.n_train, c.n_test, c.select_metric) == (n, 872, "loss")
        long = method.endswith("-t400")  # the budget curve 4x further: 400 steps, dev every 20
        assert (c.steps, c.eval_every) == (400, 20) if long else c.steps // c.eval_every == 10, method
        assert c.eval_zero_shot and c.dev_best, method
        if c.mechanism in ("pac-zpl", "pac-mi"):
            assert c.num_subsets == (16 if "-m16" in method else 128) and c.steps == (400 if long else steps)
    assert {c.epsilon for m in ("lora-dpsgd-eps2", "lora-dpsgd-eps1", "lora-dpsgd-eps0.5")
            for c in by_method[m]} == {0.5, 1.0, 2.0}
    ceiling = by_method["lora-adamw"][0]
    assert ceiling.mechanism == "adamw" and ceiling.epsilon is None and ceiling.batch_size == 16


@pytest.mark.parametrize("table, classes, n, pool", [("cpu-agnews", 4, 64, 5600), ("cpu-sst5", 5, 128, 8544)])
def test_the_weak_start_tables_run_every_method_at_three_learning_rates_or_more_in_one_dtype(table, classes, n, pool):
    """cpu-agnews and cpu-sst5: PAC-ZPL at MI = 0 (coin steps skipped, M = 16), MeZO, DPZero at epsilon 2,
    DP-SGD at epsilon 1 and 2 and the AdamW ceiling, each at three learning rates or more differing in nothing else,
    from template auto with the class names, and PAC-ZPL and AdamW also from the plain prompt with the names as
    answer words; every row in bf16 (one zero-shot), dev 200, test the held-out file whole, dev loss selecting,
    a dev evaluation each tenth of the run; a DP cell keeps about n_train + n_dev of the training file's rows
    (data_fraction); a longer cell (``-t<T>``) differs from one of its method's cells in its steps (and dev's
    spacing) alone; a sweep seed sets both the data seed and the public seed. Red if a method, an epsilon or a
    learning rate is missing, rows differ in dtype, a DP cell uses the whole training file, or the seeds vary the
    data alone (the spread over seeds would leave out the directions' randomness)."""
    by_method: dict[str, list] = {}
    for name in [x for x in WEAK if x.startswith(table + "/")]:
        method = re.sub(r"-lr[0-9.e-]+$", "", name.split("/")[1])
        by_method.setdefault(method, []).append(cpu_cfg(name).validate())
        assert yaml.safe_load(resolve_recipe(name).read_text())["recipe"]["seed_field"] == ["data_seed", "seed"]
    longer = {m: cfgs for m, cfgs in by_method.items() if re.search(r"-t\d+$", m)}
    for method, cfgs in longer.items():
        del by_method[method]
        base = by_method[re.sub(r"-t\d+$", "", method)]
        for c in cfgs:
            assert c.steps == int(method.rsplit("-t", 1)[1]) and c.steps // c.eval_every == 10
            same = {k: v for k, v in c.to_dict().items() if k not in ("steps", "eval_every")}
            assert any(same == {k: v for k, v in b.to_dict().items() if k not in ("steps", "eval_every")}
                       for b in base), method
    assert set(by_method) == {"lora-zpl-skip-m16", "lora-zpl-skip-m16-plain", "lora-mezo", "lora-dpzero-eps2",
                              "lora-dpsgd-eps2", "lora-dpsgd-eps1", "lora-adamw", "lora-adamw-plain"}
    for method, cfgs in by_method.items():
        assert len({c.lr for c in cfgs}) == len(cfgs) >= 3, method  # three or more, each its own
        rest = {json.dumps({k: v for k, v in c.to_dict().items() if k != "lr"}, sort_keys=True) for c in cfgs}
        assert len(rest) == 1, method
        c = cfgs[0]
        assert len(c.labels) == classes and c.dtype == "bf16" and c.task == "classification", method
        if method.endswith("-plain"):
            assert c.template != "auto" and len(c.verbalizer) == classes
        else:
            assert c.template == "auto" and c.verbalizer is None
        assert (c.n_train, c.n_dev, c.select_metric) == (n, 200, "loss") and c.steps // c.eval_every == 10
        if c.mechanism in ("dpzero", "dp-aggzo", "dpzero-aggzo1", "dp-sgd"):
            assert c.data_fraction == pytest.approx((c.n_train + c.n_dev) / pool, abs=1e-6), method
        else:
            assert c.data_fraction == 1.0
    assert {c.epsilon for m in ("lora-dpsgd-eps2", "lora-dpsgd-eps1") for c in by_method[m]} == {1.0, 2.0}
