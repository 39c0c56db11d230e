"""``TrainConfig``'s fields as command-line flags of ``paczero train``: each field's flag, type, help (the
comment beside the field) and topic (the ``# ...`` heading above it), and the config the flags, a recipe
or a config file give (:func:`config_from_args`)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any

from paczero.config import DP_MECHANISMS, LR_SCHEDULES, MECHANISMS, ConfigError, TrainConfig, load_yaml
from paczero.recipes import check_data_given, resolve_recipe


def parse_mapping(text: str) -> dict:
    """``k=v,k=v`` or a JSON object."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not a JSON object: {e}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError("expected a JSON object")
        return value
    out = {}
    for part in text.split(","):
        if "=" not in part:
            raise argparse.ArgumentTypeError(f"expected key=value pairs, got {part!r}")
        k, v = part.split("=", 1)
        out[k.strip()] = v
    return out


def parse_verbalizer(text: str) -> dict[int, str]:
    raw = parse_mapping(text)
    try:
        return {int(k): v for k, v in raw.items()}
    except ValueError:
        raise argparse.ArgumentTypeError("verbalizer keys must be integer labels, e.g. '0= terrible,1= great'") from None


def _none_or(kind):
    def parse(text: str):
        if text.lower() in ("none", "null", "off"):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value {text!r}") from None
    return parse


def items_of(kind):
    """One value of a list flag: ``a,b`` or ``a`` (``--lora-targets q_proj,v_proj`` and ``--lora-targets
    q_proj v_proj`` give the same list; :class:`Flatten` joins the pieces)."""
    def parse(text: str) -> list:
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"empty item in {text!r}")
        try:
            return [kind(part) for part in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value in {text!r}") from None
    return parse


class Flatten(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [item for value in values for item in value])


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def parse_template(text: str) -> str:
    """A prompt template as typed in a shell: ``\\n``, ``\\t`` and ``\\\\`` stand for a newline, a tab and a
    backslash (a YAML config writes them as YAML strings do)."""
    import re

    if text.lower() in ("none", "null", "off"):  # the task's own template
        return None
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def parse_lr(text: str) -> float | tuple[float, ...] | str:
    """``--lr``: one learning rate, or several (``1e-3,5e-3,2e-2``) or ``auto`` (a small grid of the mechanism's
    family): a choice among candidate runs on dev (:mod:`paczero.run.lr_choice`)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        if "," not in text:
            return float(text)  # lr <= 0 or not finite: TrainConfig's one line
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number (2e-2), a comma list of numbers (5e-3,1e-2,2e-2) or "
                                         f"auto, got {text!r}") from None
    bad = [v for v in values if not (v > 0 and v < float("inf"))]
    if bad:
        raise argparse.ArgumentTypeError(f"every learning rate must be > 0 and finite, got {bad[0]:g}")
    if len(set(values)) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} names one learning rate: give two or more different values to "
                                         "choose among (or one value for a plain run)")
    return tuple(values)


def lr_choice_from_file(value: Any) -> tuple[float, ...] | str:
    """A YAML file's ``lr`` list (or ``auto``) as ``--lr`` would give it, checked by the same rules."""
    if value == "auto":
        return "auto"
    try:
        return parse_lr(",".join(repr(float(v)) for v in value)) if len(value) > 1 else float(value[0])
    except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
        raise ConfigError(f"lr in a file: a number, a list of two or more numbers, or auto ({e})") from None


LR_HELP = ("; several (1e-3,5e-3,2e-2) or auto (a small grid of the mechanism's family): each a full run in "
           "OUT_DIR/lr-candidates/, the lowest dev loss released in OUT_DIR, the privacy budget split over them "
           "(docs/tasks.md)")


#: choices named in the flags' help (checked by TrainConfig.validate, which names them again on bad input)
_CHOICES = {"mechanism": MECHANISMS, "lr_schedule": LR_SCHEDULES, "coin_step": ("move", "skip"),
            "noised_coef": ("bit", "posterior-mean")}
TEMPLATE_HELP = "; in the flag, \\n and \\t stand for a newline and a tab"


def field_help() -> dict[str, str]:
    """Each TrainConfig field's comment in its source (the one home of what a key means), for --help."""
    import inspect
    import re

    try:
        source = inspect.getsource(TrainConfig)
    except (OSError, TypeError):  # no source shipped: flags without help text
        return {}
    found = re.findall(r"^    (\w+): [^=\n]+=[^#\n]*#\s*(.+)$", source, flags=re.M)
    return {name: text.strip() for name, text in found}


def field_topics() -> dict[str, str]:
    """Each TrainConfig field's topic: the ``# model``, ``# task and data``, ... comment above it."""
    import inspect
    import re

    try:
        source = inspect.getsource(TrainConfig)
    except (OSError, TypeError):
        return {}
    topics, topic = {}, "settings"
    for line in source.splitlines():
        heading = re.match(r"^    # ([a-z][\w ]*)$", line)
        field = re.match(r"^    (\w+): ", line)
        if heading:
            topic = heading.group(1)
        elif field:
            topics[field.group(1)] = topic
    return topics


def add_config_flags(p: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(TrainConfig)
    helps, topics = field_help(), field_topics()
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        args = typing.get_args(hint)
        base = next((a for a in args if a is not type(None)), hint) if args else hint
        optional = type(None) in args
        default = f.default if f.default is not dataclasses.MISSING else None
        text = helps.get(f.name, "")
        if f.name in _CHOICES:
            text = (text + "; " if text else "") + "one of " + ", ".join(_CHOICES[f.name])
        if f.name in ("template", "template_candidates"):
            text += TEMPLATE_HELP
        if f.name == "lr":
            text += LR_HELP
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": (text + " " if text else "") + f"(default: {default})".replace("%", "%%")}
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif f.name == "verbalizer":
            kw["type"] = parse_verbalizer
        elif typing.get_origin(base) is dict:
            kw["type"] = parse_mapping
        elif f.name == "template_candidates":  # templates hold commas: one template a value
            kw.update(nargs="+", type=parse_template)
        elif typing.get_origin(base) is list:  # --rungs 500 1000 1500, or 500,1000,1500
            kw.update(nargs="+", type=items_of(typing.get_args(base)[0]), action=Flatten)
        elif f.name == "template":
            kw["type"] = parse_template
        elif f.name == "lr":
            kw["type"] = parse_lr
        elif base in (int, float, str):
            kw["type"] = _none_or(base) if optional else base
        topic = topics.get(f.name, "settings")
        if topic not in groups:
            groups[topic] = p.add_argument_group(topic)
        groups[topic].add_argument(flag, **kw)


def config_from_args(ns: argparse.Namespace, partial_sizes: bool = True) -> TrainConfig:
    """The config of a command line. ``partial_sizes``: one or two sample sizes given keep the others sized from
    the file (``paczero train``); False: the file sizes the run only where no size is given (``paczero regime``,
    which draws U alone)."""
    values: dict[str, Any] = {}
    recipe = getattr(ns, "recipe", None)
    config = getattr(ns, "config", None)
    if recipe and config:
        raise ConfigError("give --recipe or --config, not both")
    fields = set(TrainConfig.field_names())
    given = {k: v for k, v in vars(ns).items() if k in fields}
    if not isinstance(given.get("lr", 0.0), float):  # several values or auto: the hook of run/lr_choice.py
        given.pop("lr")
    if given.get("resume"):  # the run's own settings first: `--out-dir RUN --resume` needs no other flag
        values.update(recorded_settings(given.get("out_dir", TrainConfig.out_dir)))
    if recipe:
        values.update(load_yaml(resolve_recipe(recipe)))
    if config:
        values.update(load_yaml(config))
    values.update(given)
    if "lr" not in given and (isinstance(values.get("lr"), (list, tuple)) or values.get("lr") == "auto"):
        ns.lr = lr_choice_from_file(values.pop("lr"))  # `lr: [1e-3, 5e-3]` or `lr: auto` in a YAML: a choice on dev
    if values.get("mechanism") == "dp-sgd":  # DP-SGD's own defaults for what nothing above set
        from paczero.mechanisms.dpsgd import USER_DEFAULTS

        unset = {k: v for k, v in USER_DEFAULTS.items() if k not in values}
        values.update(unset)
    else:
        unset = {}
    if recipe:  # a recipe whose data file is not shipped (the CPU-scale table's) needs --data
        check_data_given(resolve_recipe(recipe), values, "--data PATH")
    cfg = TrainConfig.from_dict(values, source=recipe or config or "flags").validate()
    check_dp_sizes(cfg)
    if unset and not given.get("resume"):  # said once the settings are known good (bad input stays one line)
        import sys

        print("paczero: dp-sgd defaults: " + ", ".join(f"{k} {v:g}" for k, v in unset.items())
              + " (flags set them)", file=sys.stderr)
    if not set(SIZES) <= set(values) and (partial_sizes or not set(SIZES) & set(values)):  # from the file
        cfg = sizes_as_given(cfg, given=set(SIZES) & set(values))
    return cfg


SIZES = ("n_train", "n_dev", "n_test")
#: settings of a run that a resume does not take from its run.json: how this process writes the folder
_NOT_RESUMED = ("out_dir", "overwrite", "resume")


def recorded_settings(out_dir: str) -> dict[str, Any]:
    """The settings of the run in ``out_dir`` as its run.json records them (none where it holds no run: the
    resume then says so), but for where and how this process writes. Flags and files given with
    ``--resume`` go on top of them; a setting that then differs from the run's is refused as before."""
    from pathlib import Path

    from paczero.checkpoint import run_record

    path = run_record(Path(out_dir).expanduser())  # a DP run's stays in its private stage until it ends
    try:
        record = json.loads(path.read_text())
        saved = record["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(saved, dict):
        return {}
    settings = {k: v for k, v in saved.items() if k in TrainConfig.field_names() and k not in _NOT_RESUMED}
    if (record.get("prompt") or {}).get("source") == "auto":  # config holds the prompt auto chose; the run's
        settings["template"] = "auto"  # setting was auto (its candidates with it), and the resume keeps that choice
    return settings


def sizes_as_given(cfg: TrainConfig, say=None, given=()) -> TrainConfig:
    """With a sample size not set, a local data file too small for the default sizes is used as given
    (:func:`paczero.tasks.split.sizes_for_file`): the sizes named in ``given`` as set, the others from the
    file's rows. One line (``say``; default: stderr) says how, and the config records it. A DP run takes no size
    from its data (:func:`check_dp_sizes`; with some sizes given, the others keep their defaults)."""
    import sys
    from pathlib import Path

    from paczero.tasks.data import canonical_task, class_labels
    from paczero.tasks.split import sizes_for_file

    check_dp_sizes(cfg)
    if cfg.data in (None, "demo") or not Path(cfg.data).expanduser().is_file() or cfg.mechanism in DP_MECHANISMS:
        return cfg  # a DP run's sizes are its settings' (their expected sizes), never its file's
    sizes = sizes_for_file(canonical_task(cfg.task), Path(cfg.data).expanduser(),
                           {k: getattr(cfg, k) for k in SIZES}, cfg.data_seed, cfg.columns or {}, cfg.labels,
                           class_labels(cfg.task, cfg.verbalizer, cfg.labels), given=given)
    if sizes is None:
        return cfg
    named = ", ".join(f"{k} {getattr(cfg, k)}" + (" as given" if k in given else "") for k in SIZES
                      if k in given or k != "n_test")
    line = (f"paczero: data: {cfg.data} has too few rows for the default sizes ({named}): U = "
            f"{sizes['n_train']} rows, dev = {sizes['n_dev']}, test = {sizes['n_test']}, drawn with "
            "data_seed (--n-train, --n-dev and --n-test choose)")
    (say or (lambda text: print(text, file=sys.stderr)))(line)
    return cfg.replace(**sizes).validate()


def check_dp_sizes(cfg: TrainConfig) -> None:
    """A DP run (:data:`paczero.config.DP_MECHANISMS`) on a local data file takes every size from its settings,
    none from the file: under add-or-remove-one adjacency the number of training rows is private, and the sizes
    a run records (run.json, summary.json, the model card, task.json, the tracker's config, the log's sigma
    through ``q * n_train``) are public. ``n_test`` unset (no size set at all, or a test set carved as a fifth of
    the file's rows) is refused in one line (:class:`ConfigError`), before the file is read: the refusal does not
    depend on the data either."""
    from pathlib import Path

    if cfg.mechanism not in DP_MECHANISMS or cfg.data in (None, "demo") or cfg.n_test is not None \
            or cfg.test_data is not None:  # a test file of its own: test is every row of it
        return
    if Path(cfg.data).expanduser().is_file():
        raise dp_sizes_error(cfg.mechanism, "--n-train, --n-dev and --n-test")


def dp_sizes_error(mechanism: str, flags: str) -> ConfigError:
    """The one line that refuses a DP run whose sample sizes would be taken from its data (``flags``: the
    settings that fix them, in the words of the caller)."""
    return ConfigError(f"{mechanism} takes no sample size from its data: the number of training rows is private "
                       f"under add-or-remove-one adjacency and a run publishes its sizes; give {flags} "
                       "(public sizes the data holds)")
