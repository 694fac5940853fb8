"""The naming task's data side: its data config, record schemas, parse / count / fit / encode
stages and its vocabularies (docs/ARCHITECTURE.md, "Tasks"; the task class is
:mod:`dynlm.tasks.naming`).

Stages (pure functions of Arrow batches, run by Ray Data or by :mod:`dynlm.tasks.local`):

* :func:`parse_files`: ``{bytes, path}`` rows (Python files) -> one ``document`` row per function
  (:func:`dynlm.data.python_functions.extract_functions`), doc_id
  ``"<path relative to its input>::<qualname>:<lineno>"``; a file that does not parse is one
  ``quarantine`` row with the reason; a function whose name has no subtoken (``_``) is ``dropped``,
  and so, with ``data.targets: paper``, are the functions whose name is not the author's choice
  (:func:`target_exclusion`: dunders, same-file overrides); a dropped function is no target, but
  its tokens stay in its neighbours' context and its calls in their ``caller:`` features.
  The split is per FILE: the one the path names (``train/``, ``valid/``, ``test/`` ...) or that
  ``data.splits`` lists, else a hash of the path relative to its input (:func:`assign_split`),
  or with ``data.split_by: project`` of its project (:func:`dynlm.data.split.project_of`: the
  first path component), so moving the corpus elsewhere leaves every file in its split.
* :func:`count_train`: one ``{word, count}`` table of the train functions for all four
  vocabularies, each word prefixed with its vocabulary (``name\\x1fget_value``, ``sub\\x1fget``,
  ``feat\\x1fbody:self``, ``ctx\\x1f(``).
* :meth:`NamingVocab.fit`: names (as their subtokens joined by ``_``), subtokens, features and
  context tokens, most frequent first, capped and thresholded by the config.
* :class:`EncodeFunctions`: parsed rows -> :data:`ENCODED_SCHEMA` rows (+ ``split``).
"""

from __future__ import annotations

import fnmatch
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
import torch

from dynlm.config import ConfigError
from dynlm.data.config import CorpusConfig
from dynlm.data.python_functions import DEFAULT_MAX_CONTEXT, UnparseableSource, extract_functions, is_dunder
from dynlm.data.split import assign_split, file_split, project_of, relative_to_input
from dynlm.data.subtokens import split_subtokens
from dynlm.models.naming import END, PAD, START, UNK, NamingBatch, NamingSpec

SEPARATOR = "\x1f"  # between a count word's vocabulary and the word
NAME, SUBTOKEN, FEATURE, CONTEXT = "name", "sub", "feat", "ctx"
NAME_SPECIALS = ("<pad>", "<unk>")
SUBTOKEN_SPECIALS = ("<pad>", "<unk>", "<end>", "<start>")  # ids PAD, UNK, END, START of dynlm.models.naming
assert [SUBTOKEN_SPECIALS.index(s) for s in ("<pad>", "<unk>", "<end>", "<start>")] == [PAD, UNK, END, START]
VOCAB_FORMAT = "dynlm-naming-vocab"

PARSED_SCHEMA = pa.schema([
    pa.field("kind", pa.string()), pa.field("doc_id", pa.string()), pa.field("source_file", pa.string()),
    pa.field("input_file", pa.string()), pa.field("split", pa.string()), pa.field("line", pa.int64()),
    pa.field("reason", pa.string()),
    pa.field("name", pa.string()), pa.field("qualname", pa.string()), pa.field("lineno", pa.int64()),
    pa.field("class_name", pa.string()),
    pa.field("features", pa.list_(pa.string())), pa.field("context_before", pa.list_(pa.string())),
    pa.field("context_after", pa.list_(pa.string())),
])
PAYLOAD_COLUMNS = ("features", "context_before", "context_after")

ENCODED_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string()), pa.field("source_file", pa.string()), pa.field("qualname", pa.string()),
    pa.field("lineno", pa.int64()), pa.field("name", pa.string()), pa.field("name_id", pa.int32()),
    pa.field("subtoken_ids", pa.list_(pa.int32())),  # the name's subtokens, then END
    pa.field("feature_ids", pa.list_(pa.int32())),  # known features, each once, at most max_features_per_function
    pa.field("context_ids", pa.list_(pa.int32())),  # 2 * K_max: positions -K_max..-1, +1..+K_max (PAD-filled)
])


def python_stdlib() -> str:
    """The standard library folder of the running Python: the naming task's default corpus (real
    code by many authors on every machine; its ``test/`` suites and ``site-packages`` are left
    out by ``exclude``). The folder key is by content, so the same Python version gives the same
    prepared folder wherever it is installed."""
    import sysconfig

    return sysconfig.get_paths()["stdlib"]


@dataclass
class NamingDataConfig(CorpusConfig):
    """The naming task's ``data:`` section (the :class:`CorpusConfig` fields first).

    Args:
        inputs: default: the running Python's standard library (:func:`python_stdlib`).
        name_vocab_size / subtoken_vocab_size / feature_vocab_size / context_vocab_size: most
            frequent train names / subtokens / features / context tokens kept (specials excluded);
            the rest read as UNK (features outside the vocabulary are left out).
        min_name_count / min_subtoken_count / min_feature_count / min_context_count: fewer train
            occurrences than this: left out of that vocabulary.
        max_context_size: K_max, context tokens kept each side of the name (models use K <= K_max).
        max_features_per_function: the first this many known features of a function (in the
            order of :mod:`dynlm.data.python_functions`) are kept.
        valid_fraction / test_fraction / split_seed: the hash split of the files (by path
            relative to the input, or by project: ``split_by``).
        split_by: what the hash split keeps together: ``file`` (default: each file's functions
            in one split) or ``project`` (every file of a project in one split, the project
            being the first component of the path relative to the input: a top-level package
            or module of the standard library, a project's folder in a folder of projects), so
            that valid/test code comes from projects never trained on (the paper's protocol).
            Splits named by the paths or listed in ``splits`` are kept either way.
        targets: which functions are prediction targets: ``all`` (default: every function
            whose name has a subtoken) or ``paper`` (Allamanis et al.'s protocol: dunders,
            ``__init__``, ``__eq__``..., and methods that override a method of a base class of
            the same file are ``dropped`` with their reason; bases from other files are not
            seen, see :mod:`dynlm.data.python_functions`). Either way every function's tokens
            stay in the other functions' context.
        include_suffixes: files of input folders read (by the end of their name).
        exclude: files of input folders left out, by their path relative to the input: a
            pattern ending in ``/`` is a folder at any depth (``test/`` leaves out every file in
            a folder named ``test``; ``idlelib/idle_test/`` two folders in a row), any other a
            :mod:`fnmatch` pattern of the relative path or of the file name. The defaults leave
            out the test suites and installed packages of a Python installation; a corpus split
            into ``train/ valid/ test/`` folders wants ``exclude: []``. A file named in
            ``inputs`` is always read.
    """

    inputs: list[str] = field(default_factory=lambda: [python_stdlib()])
    name_vocab_size: int = 10000
    subtoken_vocab_size: int = 5000
    feature_vocab_size: int = 50000
    context_vocab_size: int = 5000
    min_name_count: int = 1
    min_subtoken_count: int = 1
    min_feature_count: int = 2
    min_context_count: int = 2
    max_context_size: int = DEFAULT_MAX_CONTEXT
    max_features_per_function: int = 64
    valid_fraction: float = 0.15
    test_fraction: float = 0.15
    split_seed: int = 0
    split_by: Literal["file", "project"] = "file"
    targets: Literal["all", "paper"] = "all"
    hashed_when_changed: ClassVar[dict[str, object]] = {"split_by": "file", "targets": "all"}  # folders keep their keys
    include_suffixes: list[str] = field(default_factory=lambda: [".py"])
    exclude: list[str] = field(default_factory=lambda: ["test/", "tests/", "idle_test/", "site-packages/",
                                                        "__pycache__/"])

    def validate(self) -> None:
        super().validate()
        for name in ("name_vocab_size", "subtoken_vocab_size", "feature_vocab_size", "context_vocab_size",
                     "min_name_count", "min_subtoken_count", "min_feature_count", "min_context_count",
                     "max_context_size", "max_features_per_function"):
            if getattr(self, name) < 1:
                raise ConfigError(f"data.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("valid_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"data.{name}: must be in [0, 1), got {getattr(self, name)}")
        if self.valid_fraction + self.test_fraction >= 1.0:
            raise ConfigError(f"data.valid_fraction + data.test_fraction must be < 1, got "
                              f"{self.valid_fraction} + {self.test_fraction}")
        if not self.include_suffixes:
            raise ConfigError("data.include_suffixes: give at least one (e.g. [.py])")

    def keeps_file(self, relative_path: str) -> bool:
        """``include_suffixes`` and not ``exclude`` (see the class docstring)."""
        if not relative_path.endswith(tuple(self.include_suffixes)):
            return False
        folders = "/" + relative_path.rsplit("/", 1)[0] + "/" if "/" in relative_path else "/"
        file_name = relative_path.rsplit("/", 1)[-1]
        for pattern in self.exclude:
            if pattern.endswith("/"):
                if "/" + pattern.strip("/") + "/" in folders:
                    return False
            elif fnmatch.fnmatchcase(relative_path, pattern) or fnmatch.fnmatchcase(file_name, pattern):
                return False
        return True


def name_key(subtokens: list[str] | tuple[str, ...]) -> str:
    """A name's entry in the name vocabulary: its subtokens joined by ``_`` (``get_http_server``)."""
    return "_".join(subtokens)


DUNDER_REASON, OVERRIDE_REASON = "dunder", "override"  # the first word of an excluded target's reason


def target_exclusion(record: dict, targets: str) -> str:
    """Why a function (an :func:`extract_functions` record) is no target under ``data.targets``
    (its ``dropped`` reason, first word :data:`DUNDER_REASON` or :data:`OVERRIDE_REASON`), or ""
    when it is one. ``all``: every function is; ``paper``: not a dunder, not a same-file override."""
    if targets == "all":
        return ""
    if is_dunder(record["name"]):
        return f"{DUNDER_REASON}: {record['name']!r} is named by Python, not by its body (data.targets: paper)"
    if record["overrides"]:
        return (f"{OVERRIDE_REASON}: overrides {record['overrides']}.{record['name']} of the same file "
                "(data.targets: paper)")
    return ""


def parse_files(batch: pa.Table, cfg_dict: dict) -> pa.Table:
    """Python files -> PARSED_SCHEMA rows (functions with their file's split, quarantined files,
    dropped functions). ``cfg_dict``'s ``inputs`` / ``splits`` are resolved like the rows' paths."""
    cfg = NamingDataConfig.from_dict(cfg_dict)
    rows: list[dict] = []
    empty = dict(name="", qualname="", lineno=0, class_name="", features=[], context_before=[], context_after=[])
    for data, path in zip(batch.column("bytes").to_pylist(), batch.column("path").to_pylist()):
        relative = relative_to_input(path, cfg.inputs)
        base = dict(source_file=path, input_file=path)
        try:
            records = extract_functions(data, relative, max_context_size=cfg.max_context_size)
        except UnparseableSource as exc:
            rows.append({**base, **empty, "kind": "quarantine", "doc_id": relative, "split": "", "line": exc.line,
                         "reason": exc.reason})
            continue
        except Exception as exc:  # noqa: BLE001 - recorded with its reason, never dropped
            rows.append({**base, **empty, "kind": "quarantine", "doc_id": relative, "split": "", "line": 0,
                         "reason": f"extract failed: {type(exc).__name__}: {exc}"})
            continue
        split = file_split(path, cfg.inputs, cfg.splits)[1] or assign_split(
            project_of(relative) if cfg.split_by == "project" else relative, seed=cfg.split_seed,
            valid_fraction=cfg.valid_fraction, test_fraction=cfg.test_fraction)
        for record in records:
            doc_id = f"{relative}::{record['qualname']}:{record['lineno']}"
            kind, reason = "document", ""
            if not split_subtokens(record["name"]):
                kind, reason = "dropped", f"name {record['name']!r} has no subtoken (no letter or digit)"
            elif excluded := target_exclusion(record, cfg.targets):
                kind, reason = "dropped", excluded
            rows.append({**base, **record, "kind": kind, "doc_id": doc_id, "split": split if kind == "document" else "",
                         "line": record["lineno"], "reason": reason})
    return pa.Table.from_pylist(rows, schema=PARSED_SCHEMA)


def count_train(batch: pa.Table) -> pa.Table:
    """``{word, count}`` of the batch's train functions: names, subtokens, features (once per
    function) and context tokens, each word prefixed with its vocabulary and SEPARATOR."""
    train = batch.filter(pc.and_(pc.equal(batch["kind"], "document"), pc.equal(batch["split"], "train")))
    counts: Counter = Counter()
    for row in train.select(["name", "features", "context_before", "context_after"]).to_pylist():
        subtokens = split_subtokens(row["name"])
        counts[NAME + SEPARATOR + name_key(subtokens)] += 1
        counts.update(SUBTOKEN + SEPARATOR + s for s in subtokens)
        counts.update(FEATURE + SEPARATOR + f for f in row["features"])
        counts.update(CONTEXT + SEPARATOR + t for t in row["context_before"] + row["context_after"])
    words = sorted(counts)
    return pa.table({"word": pa.array(words, pa.string()), "count": pa.array([counts[w] for w in words], pa.int64())})


@dataclass
class NamingVocabSpec(NamingSpec):
    """:class:`NamingSpec` plus what evaluation needs to read the model's ids as names.

    Attributes:
        names: the name vocabulary by id (``<pad>``, ``<unk>``, then subtokens joined by ``_``).
        subtokens: the subtoken vocabulary by id (``<pad>``, ``<unk>``, ``<end>``, ``<start>``, then words).
        train_names: every train name (vocabulary or not), joined by ``_``, sorted: a suggestion
            outside them is a neologism.
    """

    names: list[str] = field(default_factory=list)
    subtokens: list[str] = field(default_factory=list)
    train_names: list[str] = field(default_factory=list)


def _ranked(counts: dict[str, int], size: int, min_count: int) -> list[str]:
    """The at most ``size`` words of ``counts`` with at least ``min_count``, by count, ties by word."""
    kept = [w for w in counts if counts[w] >= min_count]
    return sorted(kept, key=lambda w: (-counts[w], w))[:size]


class NamingVocab:
    """The naming task's preprocessor: four vocabularies (index = id) and the train names.

    Args:
        names / subtokens / features / context_tokens: the vocabularies with their specials first.
        name_counts / subtoken_counts: train counts per id (UNK: the left-out words' total; END:
            one per train name).
        train_names: every train name (joined by ``_``), sorted.
        max_context_size / max_features_per_function: from the data config it was fitted with.
    """

    def __init__(self, *, names: list[str], subtokens: list[str], features: list[str], context_tokens: list[str],
                 name_counts: list[int], subtoken_counts: list[int], train_names: list[str], max_context_size: int,
                 max_features_per_function: int):
        self.names, self.subtokens, self.features, self.context_tokens = names, subtokens, features, context_tokens
        self.name_counts, self.subtoken_counts, self.train_names = name_counts, subtoken_counts, train_names
        self.max_context_size, self.max_features_per_function = max_context_size, max_features_per_function
        self.name_ids = {w: i for i, w in enumerate(names)}
        self.subtoken_ids = {w: i for i, w in enumerate(subtokens)}
        self.feature_ids = {w: i for i, w in enumerate(features)}
        self.context_ids = {w: i for i, w in enumerate(context_tokens)}
        self.spec = NamingVocabSpec(num_names=len(names), num_subtokens=len(subtokens), num_features=len(features),
                                    num_context_tokens=len(context_tokens), max_context_size=max_context_size,
                                    name_counts=list(name_counts), subtoken_counts=list(subtoken_counts),
                                    names=list(names), subtokens=list(subtokens), train_names=list(train_names))

    @classmethod
    def fit(cls, counts: dict[str, int], cfg: NamingDataConfig) -> "NamingVocab":
        """The vocabularies of the summed :func:`count_train` counts."""
        by_vocab: dict[str, dict[str, int]] = {NAME: {}, SUBTOKEN: {}, FEATURE: {}, CONTEXT: {}}
        for word, count in counts.items():
            vocab, _, text = word.partition(SEPARATOR)
            by_vocab[vocab][text] = count
        names = _ranked(by_vocab[NAME], cfg.name_vocab_size, cfg.min_name_count)
        subtokens = _ranked(by_vocab[SUBTOKEN], cfg.subtoken_vocab_size, cfg.min_subtoken_count)
        total_names = sum(by_vocab[NAME].values())
        name_unk = total_names - sum(by_vocab[NAME][n] for n in names)
        subtoken_unk = sum(by_vocab[SUBTOKEN].values()) - sum(by_vocab[SUBTOKEN][s] for s in subtokens)
        return cls(names=[*NAME_SPECIALS, *names], subtokens=[*SUBTOKEN_SPECIALS, *subtokens],
                   features=[*NAME_SPECIALS, *_ranked(by_vocab[FEATURE], cfg.feature_vocab_size, cfg.min_feature_count)],
                   context_tokens=[*NAME_SPECIALS, *_ranked(by_vocab[CONTEXT], cfg.context_vocab_size,
                                                            cfg.min_context_count)],
                   name_counts=[0, name_unk, *[by_vocab[NAME][n] for n in names]],
                   subtoken_counts=[0, subtoken_unk, total_names, 0, *[by_vocab[SUBTOKEN][s] for s in subtokens]],
                   train_names=sorted(by_vocab[NAME]), max_context_size=cfg.max_context_size,
                   max_features_per_function=cfg.max_features_per_function)

    def to_json(self) -> str:
        return json.dumps({"format": VOCAB_FORMAT, "version": 1, "names": self.names, "subtokens": self.subtokens,
                           "features": self.features, "context_tokens": self.context_tokens,
                           "name_counts": self.name_counts, "subtoken_counts": self.subtoken_counts,
                           "train_names": self.train_names, "max_context_size": self.max_context_size,
                           "max_features_per_function": self.max_features_per_function}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "NamingVocab":
        data = json.loads(text)
        if data.pop("format", None) != VOCAB_FORMAT or data.pop("version", None) != 1:
            raise ValueError(f"not a {VOCAB_FORMAT} version 1 preprocessor (another task's preprocessor.json?)")
        return cls(**data)

    def save(self, path) -> None:
        from pathlib import Path

        Path(path).write_text(self.to_json(), encoding="utf-8")

    def known_names(self) -> set[tuple[str, ...]]:
        """The train names as subtoken tuples (a suggestion outside them is a neologism)."""
        return {tuple(name.split("_")) for name in self.train_names}

    def encode(self, record: dict) -> dict:
        """One function (a parsed row or an :func:`extract_functions` record) -> its ids
        (``name_id``, ``subtoken_ids`` with END, ``feature_ids``, ``context_ids``)."""
        subtokens = split_subtokens(record["name"])
        features = [self.feature_ids[f] for f in record["features"] if f in self.feature_ids]
        width = self.max_context_size
        before = [self.context_ids.get(t, UNK) for t in record["context_before"][-width:]] if width else []
        after = [self.context_ids.get(t, UNK) for t in record["context_after"][:width]]
        return {"name_id": self.name_ids.get(name_key(subtokens), UNK),
                "subtoken_ids": [self.subtoken_ids.get(s, UNK) for s in subtokens] + [END],
                "feature_ids": list(dict.fromkeys(features))[: self.max_features_per_function],
                "context_ids": [PAD] * (width - len(before)) + before + after + [PAD] * (width - len(after))}


class EncodeFunctions:
    """Encode stage: parsed rows -> ENCODED_SCHEMA rows plus ``split`` (one vocabulary per actor)."""

    def __init__(self, preprocessor_json: str):
        self.vocab = NamingVocab.from_json(preprocessor_json)

    def __call__(self, batch: pa.Table) -> pa.Table:
        docs = batch.filter(pc.equal(batch["kind"], "document"))
        rows = []
        for row in docs.to_pylist():
            rows.append({"doc_id": row["doc_id"], "source_file": row["source_file"], "qualname": row["qualname"],
                         "lineno": row["lineno"], "name": row["name"], **self.vocab.encode(row)})
        table = pa.Table.from_pylist(rows, schema=ENCODED_SCHEMA)
        return table.append_column("split", docs["split"])


# ------------------------------------------------------------------------------------ batches
@dataclass
class FunctionBatch:
    """What the naming task's loops pass around: the model's input and what scoring needs besides.

    Attributes:
        inputs: the :class:`NamingBatch` (features, context, names, subtokens) the model reads.
        truths: per function its true name's subtokens (strings: an out-of-vocabulary subtoken
            stays itself, so it can never be matched).
        spec: the vocabulary spec the ids are read with (suggestions -> strings, train names).
        dunders: per function whether its name is a dunder (``__init__``: the metrics report
            the other functions apart, :class:`dynlm.tasks.naming_metrics.NamingMetrics`).
    """

    inputs: NamingBatch
    truths: list[tuple[str, ...]]
    spec: NamingVocabSpec
    dunders: list[bool]

    def to(self, device) -> "FunctionBatch":
        return FunctionBatch(self.inputs.to(device), self.truths, self.spec, self.dunders)

    @property
    def size(self) -> int:
        return self.inputs.size

    @property
    def num_documents(self) -> int:
        """Functions with a name (an inactive row has none)."""
        return int((self.inputs.names != PAD).sum())

    num_padded = 0  # functions are not padded into steps


def _padded(rows: list[list[int]], min_width: int = 1) -> torch.Tensor:
    """``[len(rows), max(len)]`` long, PAD-filled."""
    width = max([min_width, *map(len, rows)])
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, ids in enumerate(rows):
        out[i, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
    return out


def collate_functions(rows: list[dict], spec: NamingVocabSpec) -> FunctionBatch:
    """Encoded rows -> a :class:`FunctionBatch` (features ``[B, F]``, context ``[B, 2*K_max]``,
    names ``[B]``, subtokens ``[B, S]``)."""
    context = _padded([row["context_ids"] for row in rows], 2 * spec.max_context_size)
    if context.shape[1] != 2 * spec.max_context_size:
        raise ValueError(f"encoded rows have {context.shape[1]} context ids, the spec wants 2 * {spec.max_context_size}")
    inputs = NamingBatch(features=_padded([row["feature_ids"] for row in rows]), context=context,
                         names=torch.tensor([row["name_id"] for row in rows], dtype=torch.long),
                         subtokens=_padded([row["subtoken_ids"] for row in rows]))
    return FunctionBatch(inputs, [tuple(split_subtokens(row["name"])) for row in rows], spec,
                         [is_dunder(row["name"]) for row in rows])


def inactive_batch(spec: NamingVocabSpec) -> FunctionBatch:
    """One PAD row: no name, no subtoken, so no prediction event (zero loss, zero gradient)."""
    row = {"name": "", "name_id": PAD, "subtoken_ids": [], "feature_ids": [], "context_ids": [PAD] * (2 * spec.max_context_size)}
    return collate_functions([row], spec)


def batch_functions(rows, spec: NamingVocabSpec, batch_size: int, *, seed: int | None = 0):
    """Batches of ``batch_size`` rows, shuffled with ``seed`` (None: in the given order)."""
    rows = list(rows)
    if seed is not None:
        random.Random(seed).shuffle(rows)
    for start in range(0, len(rows), batch_size):
        yield collate_functions(rows[start : start + batch_size], spec)


__all__ = ["DUNDER_REASON", "ENCODED_SCHEMA", "EncodeFunctions", "FunctionBatch", "NamingDataConfig", "NamingVocab",
           "NamingVocabSpec", "OVERRIDE_REASON", "PARSED_SCHEMA", "PAYLOAD_COLUMNS", "batch_functions",
           "collate_functions", "count_train", "inactive_batch", "name_key", "parse_files", "target_exclusion"]
