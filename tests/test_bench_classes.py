"""`paczero bench --against-two-classes`: the step over every class of a file against its two-class step."""
from __future__ import annotations

from paczero.bench import BenchConfig, measure
from paczero.bench.classes import classes_table
from paczero.tasks.data import SUPPORT_DEMO_PATH

#: the shipped support file's six request types, each answered by a two-token phrase on SmolLM2's tokenizer
SIX = BenchConfig(model="tiny-llama", task="classification", data=str(SUPPORT_DEMO_PATH),
                  columns={"sentence": "prompt", "label": "request"},
                  labels=["damaged", "password", "address", "cancel", "late", "refund"],
                  verbalizer={0: " damaged item", 1: " password reset", 2: " address change", 3: " cancel order",
                              4: " late delivery", 5: " refund request"},
                  template="{sentence}\nRequest:", two_classes=True, n=12, num_subsets=2, steps=1,
                  scaling=False, memory=False, plain=False, threads=1)


def test_six_classes_against_two_on_the_same_rows():
    """Six classes of two-token words and the same rows over two classes are both one model row an example
    (every option from one forward), timed in one run. Red when the options are read one row each
    (``scoring="per_candidate"`` or the packed layout off: 6 N model rows against 2 N)."""
    res = measure(SIX, log=lambda s: None)
    assert res["classes"] == 6 and res["answer_tokens"] == [2] * 6
    assert res["model_rows"] == res["two_class_model_rows"] == SIX.n
    assert res["step_s"] > 0 and res["two_class_step_s"] > 0 and res["ratio"] > 0 and res["cpu_ratio"] > 0
    assert "| tiny-llama" in classes_table([res])


def test_the_two_class_harness_keeps_the_prompts_and_folds_the_labels():
    """The two-class side scores the first two answer words on the same prompts, each label modulo 2."""
    from paczero.bench.classes import two_class_harness
    from paczero.bench.harness import Harness

    h = Harness(SIX)
    two = two_class_harness(h)
    assert two.task.verbalizer == {0: " damaged item", 1: " password reset"} and two.task.template == h.task.template
    assert [e.prompt_ids.tolist() for e in two.universe] == [e.prompt_ids.tolist() for e in h.universe]
    assert [e.label for e in two.universe] == [e.label % 2 for e in h.universe]
    assert {e.label for e in h.universe} - {0, 1}  # labels the fold moves


def test_against_two_classes_with_dp_sgd_is_one_line_exit_2(capsys):
    from paczero.cli import main

    assert main(["bench", "--against-two-classes", "--mechanism", "dp-sgd"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--against-two-classes" in err[0]
