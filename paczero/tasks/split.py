"""The train, dev and test splits of a task's examples.

``load_splits(task)`` follows the paper's protocol by default: ``n_train`` and ``n_dev`` examples sampled
(seeded, disjoint) from the train split, and the test split taken from the validation split (all 872 for
SST-2, 1000 sampled for SQuAD). ``source`` may instead name a local file (read and normalised by
:mod:`paczero.tasks.data`) or ``"demo"`` (the sentiment set shipped with the package).

Two ways to split a local file's rows:

* **exact** (:func:`split_records`, every run but a DP one): seeded permutations draw exactly ``n_train``,
  ``n_dev`` and ``n_test`` rows. Removing one row of the file moves every later index, so many rows change
  split: fine where U is public (PAC runs, whose guarantee is about S* given U) or nothing is private.
* **stable** (:func:`stable_split`, the DP mechanisms on a local file or rows given in memory): each row's split
  and its membership in U depend on that row's content and the public settings alone (a keyed hash of the row
  with the public data seed), so removing or adding one row of the file changes that row's split and nothing
  else: add-or-remove-one adjacency of the file is add-or-remove-one adjacency of U, and dev and test do not
  move when a training row does. U's size is then private, and the public ``n_train`` is its expected size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from paczero.tasks.data import (CLASSIFICATION, DEFAULT_TEST, DEMO_COLUMNS, DEMO_PATH, DEV_SPLITS, HUB,
                                SUPPORT_DEMO_PATH, _canonical, canonical_rows, canonical_task, read_records)


def load_splits(
    task_name: str,
    source: str | Path | None = None,
    n_train: int | None = 1000,
    n_dev: int | None = 500,
    n_test: int | None = None,
    seed: int = 0,
    columns: Mapping[str, str] | None = None,
    labels: Sequence[str] | None = None,
    classes: frozenset[int] | None = None,
    stable: bool = False,
    data_fraction: float = 1.0,
    dev_source: str | Path | None = None,
    test_source: str | Path | None = None,
) -> tuple[list[dict], list[dict], list[dict]]:
    """``(train, dev, test)`` lists of example dicts for ``task_name``.

    ``source``: ``None`` (the hub dataset; the demo set for task ``demo``),
    ``"demo"`` or a local file path. ``columns`` maps canonical field names to
    the file's column names (``{"sentence": "text"}``); unmapped fields are read
    from columns of the same name. ``n_train=None`` takes every train example
    left after the dev sample; ``n_dev=None`` likewise; ``n_test=None`` keeps
    the task default (whole split, 1000 for SQuAD, 20% when carved from one
    file). Sampling is seeded and the three splits are disjoint. ``labels`` names the classes of a
    classification task: a label that is one of the names becomes its position (integer labels stay).
    ``classes``: the integer labels the task scores (:func:`class_labels`); a row with another label is
    refused, naming its row of the file, before any tokenizer or model loads. ``stable``: a local file is
    split by :func:`stable_split` (a DP run's; ``data_fraction`` as there); the hub's public datasets and
    the demo set keep the paper's exact sampling. ``dev_source``, ``test_source``: files of their own for dev
    and test (every row of ``source`` is then a training row; no test file: the dev rows are the test too; no
    dev file: dev is drawn from ``source``'s rows).
    """
    task = canonical_task(task_name)
    for name, value in (("n_train", n_train), ("n_dev", n_dev), ("n_test", n_test)):
        if value is not None and int(value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if source is None and task in ("demo", "completion"):
        source = "demo"
    if source is not None and str(source) == "demo" and task == "completion":
        source = SUPPORT_DEMO_PATH
    elif source is not None and str(source) == "demo":
        source, columns = DEMO_PATH, {**DEMO_COLUMNS, **(columns or {})}
    if source is None and task not in HUB:
        raise ValueError(f"task {task} reads your labelled file: give --data FILE (docs/tasks.md)")
    if source is None:
        return _load_hub(task, n_train, n_dev, n_test, seed)
    split = stable_split if stable and str(source) != str(DEMO_PATH) else split_records
    extra = {"data_fraction": data_fraction} if split is stable_split else {}
    records, where = read_records(Path(source)), str(source)
    if dev_source is not None or test_source is not None:
        records, where = _own_files(records, where, dev_source, test_source)
    return split(task, records, where, n_train, n_dev, n_test, seed, columns or {}, labels, classes, **extra)


def _own_files(records: list[dict], where: str, dev_source, test_source) -> tuple[list[dict], str]:
    """The rows of the training file and of the dev and test files given beside it, as one table with a split
    column (the training file's rows: train; the dev file's: validation; the test file's, else the dev file's
    again: test), and the name messages give it."""
    if records and "split" in records[0]:
        raise ValueError(f"{where} has a split column: it assigns its own rows to splits; give dev and test "
                         "files with a data file without one")
    table = [{**row, "split": "train"} for row in records]
    if dev_source is not None:
        table += [{**row, "split": "validation"} for row in read_records(Path(dev_source))]
    test = test_source if test_source is not None else dev_source
    table += [{**row, "split": "test"} for row in read_records(Path(test))]
    return table, " + ".join(str(s) for s in (where, dev_source, test_source) if s is not None)


@contextlib.contextmanager
def _hub_offline(offline: bool):
    """huggingface_hub's and datasets' offline mode while the block runs (if ``offline``): a cached dataset
    loads, anything else fails at once."""
    if not offline:
        yield
        return
    import datasets.config
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


# -- hub datasets ------------------------------------------------------------------
def _load_hub(task, n_train, n_dev, n_test, seed):
    import datasets  # lazy: importing datasets is slow and needs no network until here

    from paczero.models import hub_unreachable

    unreachable = hub_unreachable()  # then only the cache is read: each request would retry for about 25 s
    try:
        with _hub_offline(unreachable is not None):
            data = datasets.load_dataset(HUB[task])
    except (OSError, ValueError) as exc:  # offline, unreachable or unknown: ConnectionError, DatasetNotFoundError
        reason = (f"the hub cannot be reached ({unreachable}) and the dataset is not in the datasets cache"
                  if unreachable else str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__)
        raise ValueError(f"cannot load the {task} dataset ({HUB[task]}) from the Hugging Face hub: {reason}; "
                         f"connect once (it is cached), or give a local file with --data (docs/tasks.md)") from None
    train_pool = [_canonical(task, row) for row in data["train"]]
    test_pool = [_canonical(task, row) for row in data["validation"]]
    rng = np.random.default_rng(seed)
    train, dev = _sample_train_dev(train_pool, n_train, n_dev, rng, "train split")
    test = _sample(test_pool, n_test if n_test is not None else DEFAULT_TEST[task], rng, "validation split")
    return train, dev, test


def sizes_for_file(task, path, sizes: dict, seed, columns, labels=None, classes=None, given=()) -> dict | None:
    """None when the local file ``path`` holds enough rows for ``sizes`` (n_train, n_dev, n_test); else the
    sizes that use its rows as given, as :mod:`paczero.api` uses a ``train_dataset``: a split column's
    train and test rows whole (dev: its dev rows, else a fifth of train), else a fifth of the rows for test,
    a fifth of the rest for dev and the rest as U. The sizes named in ``given`` are kept as ``sizes`` has them
    (the others sized as above, dev no more than what the given ones leave). A file that cannot be split at all
    raises its one-line ValueError."""
    records = read_records(Path(path))
    try:
        split_records(task, records, str(path), sizes["n_train"], sizes["n_dev"], sizes["n_test"], seed, columns,
                      labels, classes)
        return None
    except ValueError:
        pass
    fixed = {k: sizes[k] for k in given}
    n_test = fixed.get("n_test")
    if records and "split" in records[0]:
        names = [str(r.get("split", "")).strip().lower() for r in records]
        own_dev = "test" in names and any(name in DEV_SPLITS for name in names)
        pool = names.count("train")
        n_dev = None if own_dev else max(1, round(0.2 * pool))
    else:
        if n_test is None:
            n_test = max(1, round(0.2 * len(records))) if len(records) > 1 else 0
        pool = len(records) - n_test
        n_dev = max(1, round(0.2 * pool))
    if n_dev is not None and fixed.get("n_train") is not None:  # dev from what the given U leaves
        n_dev = max(1, min(n_dev, pool - fixed["n_train"]))
    n_dev = fixed.get("n_dev", n_dev)
    train, dev, test = split_records(task, records, str(path), fixed.get("n_train"), n_dev, n_test, seed, columns,
                                     labels, classes)
    return {"n_train": len(train), "n_dev": len(dev), "n_test": len(test)}


def _refuse_one_class(task: str, rows: list[dict], where: str, labels: Sequence[str] | None) -> None:
    """A classification file whose training rows all hold one label cannot train a classifier: one line."""
    if task not in CLASSIFICATION or not rows:
        return
    found = {row["label"] for row in rows}
    if len(found) == 1:
        label = next(iter(found))
        name = repr(labels[label]) if labels and 0 <= label < len(labels) else str(label)
        raise ValueError(f"{where}: every training row has label {name}, one class; a classifier trains on rows "
                         "of at least two classes (is the label column the right one? --columns label=COLUMN)")


def split_records(task, records, where, n_train, n_dev, n_test, seed, columns, labels=None, classes=None):
    """``(train, dev, test)`` example lists of ``records``, the rows of a local file or of a table given in
    memory (:mod:`paczero.api`), normalised and split alike (``where`` names them in messages): a ``split``
    column assigns rows to splits, else test, train and dev are sampled (seeded, disjoint) from all rows."""
    rows = canonical_rows(task, records, where, columns, labels, classes)
    present = set(records[0])
    rng = np.random.default_rng(seed)
    splits = [str(r.get("split", "")).strip().lower() for r in records] if "split" in present else None
    if n_train != 0:  # rows to train on (not paczero eval's whole file)
        _refuse_one_class(task, rows if splits is None else [r for r, n in zip(rows, splits) if n == "train"],
                          where, labels)
    if splits is None:
        default_test = max(1, round(0.2 * len(rows))) if len(rows) > 1 else 0
        n_test = default_test if n_test is None else int(n_test)
        if n_test > len(rows):
            raise ValueError(f"{where} has {len(rows)} examples, fewer than n_test={n_test}")
        order = rng.permutation(len(rows))
        test = [rows[i] for i in order[:n_test]]
        pool = [rows[i] for i in order[n_test:]]
        train, dev = _sample_train_dev(pool, n_train, n_dev, rng, f"{where} (after {n_test} test examples)")
        return train, dev, test

    by_split: dict[str, list[dict]] = {}
    for name, row in zip(splits, rows):
        by_split.setdefault(name, []).append(row)
    if "train" not in by_split:
        raise ValueError(f"{where} has a split column but no 'train' rows (splits: {sorted(by_split)})")
    dev_name = next((s for s in DEV_SPLITS if s in by_split), None)
    if "test" in by_split:
        test_pool = by_split["test"]
    elif dev_name is not None:
        test_pool, dev_name = by_split.pop(dev_name), None
    else:
        raise ValueError(f"{where} has a split column but no 'test' or validation rows (splits: {sorted(by_split)})")
    if dev_name is None:
        train, dev = _sample_train_dev(by_split["train"], n_train, n_dev, rng, f"{where} 'train' rows")
    else:
        dev = _sample(by_split[dev_name], n_dev, rng, f"{where} {dev_name!r} rows")
        train = _sample(by_split["train"], n_train, rng, f"{where} 'train' rows")
    test = _sample(test_pool, n_test, rng, f"{where} test rows")
    return train, dev, test


# -- exact sampling ------------------------------------------------------------------
def _sample(pool: Sequence[dict], n: int | None, rng, where: str) -> list[dict]:
    """``n`` seeded picks from ``pool`` (all of it, in order, when ``n`` is None)."""
    if n is None:
        return list(pool)
    if n > len(pool):
        raise ValueError(f"{where} has {len(pool)} examples, fewer than the {n} requested")
    return [pool[i] for i in rng.permutation(len(pool))[:n]]


def _sample_train_dev(pool, n_train, n_dev, rng, where):
    """Disjoint seeded train and dev samples from one pool (dev drawn after train)."""
    if n_train is None and n_dev is None:
        raise ValueError("n_train and n_dev cannot both be None when dev is carved from the train pool")
    want_train = n_train if n_train is not None else len(pool) - n_dev
    want_dev = n_dev if n_dev is not None else len(pool) - n_train
    if want_train < 0 or want_dev < 0 or want_train + want_dev > len(pool):
        raise ValueError(
            f"{where} has {len(pool)} examples, fewer than n_train+n_dev={n_train}+{n_dev}"
        )
    order = rng.permutation(len(pool))
    train = [pool[i] for i in order[:want_train]]
    dev = [pool[i] for i in order[want_train:want_train + want_dev]]
    return train, dev


# -- the stable split (DP runs) ---------------------------------------------------------
def row_draws(rows: Sequence[Mapping], seed: int) -> np.ndarray:
    """``[len(rows), 2]`` numbers in [0, 1), two a row: a keyed hash (BLAKE2b keyed by the public data seed) of
    the row's canonical fields, so a row's draws depend on nothing else the file holds (nor on its position):
    column 0 assigns its split, column 1 whether it is used at all (``data_fraction``)."""
    key = f"paczero stable split, data seed {int(seed)}".encode()
    out = np.empty((len(rows), 2))
    for i, row in enumerate(rows):
        text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode()
        digest = hashlib.blake2b(text, key=key, digest_size=16).digest()
        out[i] = [(int.from_bytes(digest[j:j + 8], "big") >> 11) / 2.0 ** 53 for j in (0, 8)]
    return out


def stable_split(task, records, where, n_train, n_dev, n_test, seed, columns, labels=None, classes=None,
                 data_fraction: float = 1.0):
    """``(train, dev, test)`` of ``records`` such that each row's split depends only on that row and the public
    settings (``n_train``, ``n_dev``, ``n_test``, ``seed``, ``data_fraction``):

    * whether it is used: a row that a ``split`` column names dev or test always; any other row with
      probability ``data_fraction`` (1: every row; a file much larger than the sizes: their sum over its rows);
    * its split: a ``split`` column's value; without one, test with probability ``n_test / S``, dev with
      ``n_dev / S`` and U otherwise (``S = n_train + n_dev + n_test``: the sizes are the expected ones of a file
      of S used rows); with a split column but no dev rows, dev is carved from the training rows with
      probability ``n_dev / (n_train + n_dev)``.

    Removing one row of the file changes that row's split and nothing else: U loses at most that row, and dev
    and test are the same when a training row is removed. No split is capped at its size (a cap ranks rows
    against each other): the sizes are expected sizes, and U's is private; the public ``n_train`` is what a DP
    mechanism normalises by. Rows come back in the file's order."""
    rows = canonical_rows(task, records, where, columns, labels, classes)
    if isinstance(data_fraction, bool) or not 0 < data_fraction <= 1:
        raise ValueError(f"data_fraction must be in (0, 1], got {data_fraction!r}")
    draws = row_draws(rows, seed)
    named = "split" in records[0]
    pools = [str(r.get("split", "")).strip().lower() for r in records] if named else [None] * len(rows)
    dev_name = next((s for s in DEV_SPLITS if s in pools), None)
    if named and "train" not in pools:
        raise ValueError(f"{where} has a split column but no 'train' rows (splits: {sorted(set(pools))})")
    if named and "test" not in pools and dev_name is None:
        raise ValueError(f"{where} has a split column but no 'test' or validation rows (splits: {sorted(set(pools))})")
    test_name = "test" if not named or "test" in pools else dev_name
    dev_name = None if test_name == dev_name else dev_name
    sizes = {"n_train": n_train, "n_dev": n_dev, "n_test": n_test}
    needed = ("n_train", "n_dev", "n_test") if not named else ("n_train", "n_dev") if dev_name is None else ()
    unset = [name for name in needed if sizes[name] is None]
    if unset:
        raise ValueError(f"the stable split (a DP run's) draws every split from public sizes: give {', '.join(unset)}")
    for i, name in enumerate(pools):
        u, kept = draws[i, 0], draws[i, 1] < data_fraction
        if named and name == test_name:
            pools[i] = "test"
        elif named and name == dev_name:
            pools[i] = "dev"
        elif not kept or (named and name != "train"):
            pools[i] = None  # not used: left out by data_fraction, or a split name that is none of these
        elif not named:
            total = n_train + n_dev + n_test
            pools[i] = "test" if u * total < n_test else "dev" if u * total < n_test + n_dev else "train"
        else:
            pools[i] = "dev" if dev_name is None and u * (n_train + n_dev) < n_dev else "train"
    if n_train != 0:  # rows to train on (not paczero eval's whole file)
        _refuse_one_class(task, [r for r, name in zip(rows, pools) if name == "train"], where, labels)
    return tuple([rows[i] for i, name in enumerate(pools) if name == pool] for pool in ("train", "dev", "test"))
