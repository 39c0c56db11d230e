"""Reading a task's examples and normalising them (splitting them: :mod:`paczero.tasks.split`).

A local ``.jsonl``/``.json``/``.csv``/``.tsv``/``.parquet`` file is read as rows of named fields
(:func:`read_records`) and each row becomes a plain dict with the task's canonical fields
(:func:`canonical_rows`): ``sentence``/``label`` for classification, ``id``/``title``/``context``/``question``/
``answers`` (a list of strings) for SQuAD, ``prompt``/``completion`` or ``messages`` for completion. Errors are one
line naming the file's row.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

DEMO_PATH = Path(__file__).resolve().parent.parent / "data" / "demo_sentiment.jsonl"
SUPPORT_DEMO_PATH = DEMO_PATH.with_name("demo_support_replies.jsonl")  # the completion task's example set

TASK_ALIASES = {
    "sst2": "sst2",
    "sst-2": "sst2",
    "sst_2": "sst2",
    "glue/sst2": "sst2",
    "stanfordnlp/sst2": "sst2",
    "squad": "squad",
    "squad1": "squad",
    "squad1.1": "squad",
    "squad_v1": "squad",
    "squad-v1": "squad",
    "rajpurkar/squad": "squad",
    "classification": "classification",
    "text-classification": "classification",
    "demo": "demo",
    "demo_sentiment": "demo",
    "demo-sentiment": "demo",
    "completion": "completion",
    "prompt-completion": "completion",
    "chat": "completion",
}

# Canonical fields per task and the hub column that holds each.
FIELDS = {
    "sst2": ("sentence", "label"),
    "classification": ("sentence", "label"),
    "demo": ("sentence", "label"),
    "squad": ("id", "title", "context", "question", "answers"),
    "completion": ("prompt", "completion", "messages", "answer"),  # prompt and completion, or messages
}
HUB = {"sst2": "stanfordnlp/sst2", "squad": "rajpurkar/squad"}
DEFAULT_TEST = {"sst2": None, "classification": None, "demo": None, "squad": 1000}  # None: the whole split
DEMO_COLUMNS = {"sentence": "text", "label": "label"}
CLASSIFICATION = ("sst2", "classification", "demo")  # the tasks whose examples are a sentence and a class label
DEV_SPLITS = ("dev", "validation", "valid", "val")


def canonical_task(name: str) -> str:
    """``sst2``, ``classification``, ``squad``, ``demo`` or ``completion`` for any accepted spelling; ``ValueError`` otherwise."""
    key = str(name).strip().lower()
    if key not in TASK_ALIASES:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(set(TASK_ALIASES.values()))}")
    return TASK_ALIASES[key]



# -- local files ---------------------------------------------------------------------
def read_records(path: Path) -> list[dict]:
    """Rows of a ``.jsonl``/``.ndjson``/``.json``/``.csv``/``.tsv``/``.parquet`` file as dicts (a UTF-8
    byte-order mark, as spreadsheet programs write, is allowed). Errors name the file's line or record."""
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            with path.open(encoding="utf-8-sig") as f:
                return _records([(n, _json_line(path, n, line)) for n, line in enumerate(f, 1) if line.strip()],
                                path, "line")
        if suffix == ".json":
            text = path.read_text(encoding="utf-8-sig")
            try:
                data = json.loads(text)
            except json.JSONDecodeError:  # JSON lines under a .json name
                return _records([(n, _json_line(path, n, line)) for n, line in enumerate(text.splitlines(), 1)
                                 if line.strip()], path, "line")
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            if not isinstance(data, list):
                raise ValueError(f"{path}: expected a list of records (or {{'data': [...]}})")
            return _records(list(enumerate(data, 1)), path, "record")
        if suffix in (".csv", ".tsv"):
            with path.open(encoding="utf-8-sig", newline="") as f:
                reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
                rows = []
                for row in reader:
                    if None in row:  # more cells than the header has columns
                        hint = _delimiter_hint(reader.fieldnames or [])
                        if hint:  # a header of one column holding ';' or a tab: another delimiter, not a stray comma
                            raise ValueError(f"{path}: its {hint}")
                        raise ValueError(f"{path} line {reader.line_num}: more fields than the header's "
                                         f"{len(reader.fieldnames or [])} (a value with an unquoted "
                                         f"{'tab' if suffix == '.tsv' else 'comma'}?)")
                    rows.append(row)
                return rows
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
    except UnicodeDecodeError as exc:
        raise ValueError(f"cannot read {path}: it is not UTF-8 text ({exc.reason}); save it as UTF-8") from None
    except (OSError, csv.Error) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    raise ValueError(f"unsupported data file type {suffix!r} ({path}); use .jsonl, .json, .csv, .tsv or .parquet")


def _json_line(path: Path, number: int, line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"cannot read {path} line {number}: {exc.msg} (column {exc.colno})") from None


def _records(numbered: list[tuple[int, Any]], path: Path, unit: str) -> list[dict]:
    for number, record in numbered:
        if not isinstance(record, dict):
            raise ValueError(f"{path} {unit} {number}: expected an object of named fields, got a {type(record).__name__}")
    return [record for _, record in numbered]


def same_columns(data: str | Path, columns: Mapping[str, str] | None) -> dict | None:
    """A run's column mapping for another file (``paczero eval --data FILE``) where that file holds every column
    the mapping names; else None (the task's own field names, and a missing one gets its --columns hint)."""
    if not columns:
        return None
    try:
        records = read_records(Path(data).expanduser())
    except ValueError:
        return None  # the evaluation reads it again and says what is wrong
    return dict(columns) if records and set(columns.values()) <= set(records[0]) else None


def class_labels(task: str, verbalizer: Mapping | None = None, labels: Sequence[str] | None = None):
    """The integer labels a classification task scores: its verbalizer's keys (``labels``: their positions;
    neither: SST-2's 0 and 1); None for the other tasks (or a verbalizer the task itself will refuse)."""
    if canonical_task(task) not in CLASSIFICATION:
        return None
    if verbalizer:
        try:
            return frozenset(int(k) for k in verbalizer)
        except (TypeError, ValueError):
            return None
    if labels:
        return frozenset(range(len(labels)))
    from paczero.tasks.classification import SST2_VERBALIZER

    return frozenset(SST2_VERBALIZER)


def canonical_rows(task, records, where, columns, labels=None, classes=None) -> list[dict]:
    """The task's canonical fields of each record (``columns`` maps fields to column names), checked: a
    missing column, an empty field or a label the task does not score is one line naming the record."""
    if not records:
        raise ValueError(f"{where} holds no examples")
    unknown = sorted(set(columns) - set(FIELDS[task]))
    if unknown:
        raise ValueError(f"columns mapping names unknown field(s) {unknown}; fields of {task}: {list(FIELDS[task])}")
    wanted = {field: columns.get(field, field) for field in FIELDS[task]}
    present = set(records[0])
    if task in CLASSIFICATION and "sentence" not in columns and "sentence" not in present and "text" in present:
        wanted["sentence"] = "text"  # the usual name of a labelled file's text column, read without --columns
    if task == "squad":  # id and title are optional in local files
        optional = {f for f in ("id", "title") if f not in columns}
    elif task == "completion":  # prompt and completion, or messages; a reference answer if any
        optional = {"answer"} | ({"prompt", "completion"} if wanted["messages"] in present else {"messages"})
    else:
        optional = set()
    missing = [col for field, col in wanted.items() if col not in present and field not in optional]
    if missing:
        either = " (or a messages column)" if task == "completion" else ""
        unused = sorted(present - set(wanted.values()) - {"split"})
        raise ValueError(f"{where} lacks column(s) {missing}{either}; it has {sorted(present)}"
                         f"{_columns_hint(wanted, missing, present, unused)}")
    rows = []
    for i, record in enumerate(records):
        row = {field: record.get(col) for field, col in wanted.items()}
        if task == "squad":
            row["id"] = str(row["id"]) if row["id"] is not None else str(i)
            row["title"] = row["title"] if row["title"] is not None else ""
        rows.append(_canonical(task, row, where=f"{where} record {i + 1}", labels=labels, classes=classes,
                               names=wanted))
    return rows


def _columns_hint(wanted: Mapping[str, str], missing: list, present: set, unused: list) -> str:
    """How to fix a file that lacks columns: a header read as one column that holds a ';' or a tab (another
    delimiter than the file's suffix says), else the --columns mapping (a field for the one unused column, or
    a field=COLUMN pattern for each missing one)."""
    hint = _delimiter_hint(list(present))
    if hint:
        return "; its " + hint
    fields = [next(f for f, c in wanted.items() if c == col) for col in missing]
    if len(missing) == 1 and len(unused) == 1:  # one field unnamed, one column unused: they are each other's
        return f"; map it with --columns {fields[0]}={unused[0]} (Python: columns={{'{fields[0]}': '{unused[0]}'}})"
    if any(f == c for f, c in zip(fields, missing)):  # fields not mapped yet
        pattern = ",".join(f"{f}=COLUMN" for f in fields)
        return f"; map them to its columns with --columns {pattern} (Python: columns={{...}})"
    return ""


def _delimiter_hint(header: list) -> str | None:
    """For a CSV header read as one column that holds a ';' or a tab (the file's values are separated by
    another delimiter than its suffix says): what to do, else None."""
    if len(header) != 1 or not isinstance(header[0], str):
        return None
    for mark, name in ((";", "semicolons"), ("\t", "tabs")):
        if mark in header[0]:
            fix = "save it with commas" + (", or name it .tsv" if mark == "\t" else "")
            return (f"header is one column, {header[0]!r}: are its values separated by {name}? A .csv file is read "
                    f"with commas ({fix})")
    return None


def _canonical(task: str, row: Mapping, where: str = "dataset row", labels: Sequence[str] | None = None,
               classes: frozenset[int] | None = None, names: Mapping[str, str] | None = None) -> dict:
    """The task's canonical fields of ``row`` with normalised types (``names``: each field's column in the
    data, for messages)."""
    names = names or {}
    if task == "completion":
        return _completion(row, where)
    if task in CLASSIFICATION:
        label = row["label"]
        if labels and isinstance(label, str) and not _integer_text(label):
            if label.strip() not in labels:
                raise ValueError(f"{where}: label {_short(label)} is not one of the labels {', '.join(labels)}")
            label = list(labels).index(label.strip())
        try:
            number = float(label.strip()) if isinstance(label, str) else label
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            label = int(number)
        except (TypeError, ValueError, OverflowError, AttributeError):
            hint = "" if labels else "; name the classes with --labels (e.g. --labels negative,positive)"
            raise ValueError(f"{where}: label {_short(label)} is not an integer{hint}") from None
        if classes is not None and label not in classes:
            raise ValueError(f"{where}: label {label} is not one of the labels the verbalizer scores "
                             f"({', '.join(map(str, sorted(classes)))}); give a --verbalizer option (or --labels "
                             "name) for each label")
        return {"sentence": _text(row["sentence"], names.get("sentence", "sentence"), where), "label": label}
    answers = row["answers"]
    if isinstance(answers, Mapping):  # hub format {"text": [...], "answer_start": [...]}
        answers = answers.get("text")
    if isinstance(answers, str):
        try:
            parsed = json.loads(answers)  # CSV cells holding a JSON list
            answers = parsed if isinstance(parsed, list) else [answers]
        except json.JSONDecodeError:
            answers = [answers]
    answers = [str(a) for a in (answers or [])]
    if not answers:
        raise ValueError(f"{where}: no answers")
    return {
        "id": str(row["id"]),
        "title": str(row["title"]),
        "context": _text(row["context"], names.get("context", "context"), where),
        "question": _text(row["question"], names.get("question", "question"), where),
        "answers": answers,
    }


def _integer_text(text: str) -> bool:
    try:
        return float(text.strip()).is_integer()
    except (ValueError, OverflowError):
        return False


def _completion(row: Mapping, where: str) -> dict:
    """A completion example: ``prompt`` and ``completion`` text, or ``messages`` (a list of role/content
    objects ending in an assistant message; a JSON string in CSV cells); ``answers`` if the row has one."""
    out: dict[str, Any] = {}
    messages = row.get("messages")
    if messages is not None:
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except json.JSONDecodeError:
                raise ValueError(f"{where}: messages is not a JSON list of role/content objects") from None
        if not isinstance(messages, list) or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ValueError(f"{where}: messages must be a list of objects with role and content strings")
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            raise ValueError(f"{where}: messages must end with an assistant message after at least one other")
        if not messages[-1]["content"].strip():
            raise ValueError(f"{where}: the last (assistant) message, the completion, is empty")
        out["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
    else:
        out["prompt"] = _text(row.get("prompt"), "prompt", where)
        out["completion"] = _text(row.get("completion"), "completion", where)
    answer = row.get("answer")
    if isinstance(answer, str) and not answer.strip():  # an empty CSV cell: no reference answer
        answer = None
    if answer is not None and not (isinstance(answer, float) and math.isnan(answer)):
        if isinstance(answer, str) and answer.strip().startswith("["):
            try:
                answer = json.loads(answer)  # CSV cells holding a JSON list
            except json.JSONDecodeError:
                pass
        answers = [str(a) for a in answer] if isinstance(answer, list) else [str(answer)]
        if not any(a.strip() for a in answers):
            raise ValueError(f"{where}: answer is empty")
        out["answers"] = answers
    return out


def _text(value: Any, field: str, where: str) -> str:
    """A text field: missing, null or blank is an error (it would otherwise train on the string 'None')."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip():
        raise ValueError(f"{where}: {field} is missing or empty")
    return str(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "...'"
