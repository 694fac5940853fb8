"""Which split (train / valid / test) a document goes to: the corpus' own, or a hash.

Three rules; one prepare job uses exactly one of them for all its documents (``split_rule`` in
``manifest.json`` and the prepare table says which):

* ``config``: ``DataConfig.splits`` lists input paths per split; a file goes to the split whose
  listed path is the file itself or a folder above it.
* ``named``: the input paths name their split, as published corpora do (WikiText-2's
  ``wiki.train.tokens``, CoNLL-2012's ``conll-2012/v4/data/development/...``). See
  :func:`named_splits` for the exact rule.
* ``hash``: unsplit inputs. Each document's split comes from a hash of its id
  (:func:`assign_split`), so it never depends on the order of documents or the number of workers.
  A task may hash a coarser id: the naming task hashes the file's path, or with
  ``data.split_by: project`` its project (:func:`project_of`).

Which rule a file follows is decided once, by its data config's ``file_split(path)`` (default:
:func:`file_split`; the cloze task's config hashes CMRC-2017's ``cloze.valid.*`` files unless
``data.named_splits``, and reads CBT's ``_``-separated names when it is set): the parse stage
splits the file's documents by it and :func:`check_split_rule` records the rule from it, so the
recorded rule is the one that was applied.

Mixed inputs are an error (:class:`SplitRuleError`), never a guess: with a named corpus plus an
unnamed file, hashing the unnamed file would put some of its documents into valid/test, and a
valid/test set that is no longer the published one cannot be compared with published figures.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, Mapping, Sequence

SPLITS = ("train", "valid", "test")

# Split names recognised in input paths (lowercased), per split.
SPLIT_NAMES: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "valid": ("valid", "validation", "dev", "development"),
    "test": ("test",),
}


class SplitRuleError(ValueError):
    """The inputs do not give one clear split rule (mixed, ambiguous or unlisted files)."""


def split_fraction(doc_id: str, seed: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, doc_id)."""
    digest = hashlib.sha256(f"{seed}\x00{doc_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(doc_id: str, *, seed: int, valid_fraction: float, test_fraction: float) -> str:
    """Return ``"train"``, ``"valid"`` or ``"test"`` for a document (the ``hash`` rule).

    The same (doc_id, seed) always lands in the same split, whatever the order of documents,
    the number of workers or the other documents in the corpus.

    Args:
        doc_id: the document's stable id.
        seed: split seed (DataConfig.split_seed).
        valid_fraction: expected fraction of documents in ``valid``.
        test_fraction: expected fraction in ``test``.

    Returns:
        The split name.
    """
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(
            f"valid_fraction ({valid_fraction}) and test_fraction ({test_fraction}) must be >= 0 "
            "and sum to < 1"
        )
    u = split_fraction(doc_id, seed)
    if u < valid_fraction:
        return "valid"
    if u < valid_fraction + test_fraction:
        return "test"
    return "train"


def path_parts(path: str) -> list[str]:
    """The components of a local path or URI, scheme dropped (``s3://b/k`` -> ``["b", "k"]``).

    Ray Data gives URI rows without their scheme (``b/k``), so both forms compare equal.
    """
    path = path.split("://", 1)[-1]
    return [part for part in posixpath.normpath(path.replace("\\", "/")).split("/") if part not in ("", ".")]


def _is_within(parts: list[str], folder: list[str]) -> bool:
    return len(parts) >= len(folder) and parts[: len(folder)] == folder


def components_below_input(path: str, inputs: Sequence[str]) -> list[str]:
    """The components of ``path`` that may name its split: the input's own name and below.

    ``inputs`` are the paths the file was listed from (the longest one containing ``path`` is
    its input). For ``--input /data/wikitext-2`` and ``/data/wikitext-2/wiki.train.tokens`` this
    is ``["wikitext-2", "wiki.train.tokens"]``: folders above the input (a ``/tmp/test_x0``
    folder, a home directory) never decide a split. A path under no input gives its file name.
    """
    parts = path_parts(path)
    best = _containing_input(parts, inputs)
    if best is None:
        return parts[-1:]
    return parts[len(best) - 1:]


def _containing_input(parts: list[str], inputs: Sequence[str]) -> list[str] | None:
    """The components of the longest input that is ``parts`` or a folder above it."""
    best: list[str] | None = None
    for item in inputs:
        folder = path_parts(item)
        if folder and _is_within(parts, folder) and (best is None or len(folder) > len(best)):
            best = folder
    return best


def relative_to_input(path: str, inputs: Sequence[str]) -> str:
    """``path`` relative to the input it was listed from (posix): ``json/decoder.py`` for
    ``--input /usr/lib/python3.11``; an input that is the file itself, or a path under no
    input, gives the file name. Moving or renaming the input folder leaves it unchanged."""
    parts = path_parts(path)
    best = _containing_input(parts, inputs)
    if best is None or len(best) == len(parts):
        return parts[-1] if parts else ""
    return "/".join(parts[len(best):])


def project_of(relative_path: str) -> str:
    """The project a file belongs to: the first component of its path relative to its input
    (:func:`relative_to_input`), a top-level file's name without its suffix. For ``--input
    /usr/lib/python3.11``: ``json/decoder.py`` -> ``json``, ``os.py`` -> ``os``; for an input
    folder holding several checked-out projects, each project's folder. Hashing this instead of
    the file's path (:func:`assign_split`) keeps a whole project in one split, so valid/test
    code comes from projects never trained on."""
    parts = [part for part in relative_path.replace("\\", "/").split("/") if part not in ("", ".")]
    if not parts:
        return ""
    return parts[0] if len(parts) > 1 else posixpath.splitext(parts[0])[0]


def component_splits(component: str) -> set[str]:
    """The splits one path component names: one of its ``.``-separated pieces, lowercased, is a
    split name (``wiki.train.tokens`` and ``train`` -> train; ``dev.conll``, ``development`` ->
    valid; ``test_utils``, ``contest.txt``, ``train_2`` -> none)."""
    pieces = component.lower().split(".")
    return {split for split, names in SPLIT_NAMES.items() if any(p in names for p in pieces)}


def named_splits(path: str, inputs: Sequence[str]) -> set[str]:
    """Every split that the components of ``path`` from its input down name (usually 0 or 1)."""
    found: set[str] = set()
    for component in components_below_input(path, inputs):
        found |= component_splits(component)
    return found


def config_split(path: str, splits: Mapping[str, Sequence[str]]) -> str | None:
    """The split of ``DataConfig.splits`` whose listed path is ``path`` or a folder above it."""
    parts = path_parts(path)
    for split in SPLITS:
        if any(_is_within(parts, path_parts(listed)) for listed in splits.get(split, ())):
            return split
    return None


def file_split(path: str, inputs: Sequence[str], splits: Mapping[str, Sequence[str]]) -> tuple[str, str | None]:
    """(rule, split) of one input file; split None means "hash each document" (or an error that
    :func:`check_split_rule` reports: a file in no listed split, a name that names two splits).

    Args:
        path: the file (as Ray Data or the local reader lists it).
        inputs: ``DataConfig.inputs``, resolved the same way as ``path``.
        splits: ``DataConfig.splits``, resolved the same way (empty: no config rule).
    """
    if splits:
        return "config", config_split(path, splits)
    named = named_splits(path, inputs)
    if named:
        return "named", next(iter(named)) if len(named) == 1 else None
    return "hash", None


def _examples(paths: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(sorted(paths)[:limit])
    return shown + (f" (and {len(paths) - limit} more)" if len(paths) > limit else "")


def check_split_rule(files: Sequence[str], inputs: Sequence[str], splits: Mapping[str, Sequence[str]],
                     document_splits: Sequence[str], *, require_train: bool = True,
                     file_rule: Callable[[str], tuple[str, str | None]] | None = None) -> str:
    """The one split rule of a prepare job; raises :class:`SplitRuleError` when there is none.

    Args:
        files: the input files that gave documents.
        inputs / splits: as for :func:`file_split`.
        document_splits: the split of every document (to check that train is not empty).
        require_train: raise when named or configured splits give no train document (False
            when documents are only evaluated).
        file_rule: ``path -> (rule, split)``, the function the parse stage split the documents
            with (a data config's ``file_split``); default :func:`file_split` of ``inputs`` /
            ``splits``. The returned rule is the one it applied.

    Returns:
        ``"config"``, ``"named"`` or ``"hash"``.
    """
    if file_rule is None:
        def file_rule(path: str) -> tuple[str, str | None]:
            return file_split(path, inputs, splits)
    rules = {path: file_rule(path) for path in set(files)}
    if splits:
        unlisted = [p for p, (_, split) in rules.items() if split is None]
        if unlisted:
            raise SplitRuleError(
                f"data.splits: {len(unlisted)} input file(s) are in no listed split: {_examples(unlisted)}; "
                "list them (or a folder above them) under data.splits.train/valid/test, or remove them "
                "from data.inputs")
        unmatched = [item for paths in splits.values() for item in paths
                     if not any(_is_within(path_parts(p), path_parts(item)) for p in rules)]
        if unmatched:
            raise SplitRuleError(f"data.splits: {_examples(unmatched)} match(es) no input file with a document")
    ambiguous = [p for p, (rule, split) in rules.items() if rule == "named" and split is None]
    if ambiguous:
        raise SplitRuleError(
            f"input path(s) name more than one split: {_examples(ambiguous)} "
            f"({sorted(named_splits(sorted(ambiguous)[0], inputs))}); rename them or list them under data.splits")
    named = [p for p, (rule, _) in rules.items() if rule == "named"]
    unnamed = [p for p, (rule, _) in rules.items() if rule == "hash"]
    if named and unnamed:
        only_named = (" ".join(f"--input {p}" for p in sorted(named)) if len(named) <= 3
                      else "e.g. their train/valid/test folders")
        raise SplitRuleError(
            f"the inputs mix files whose path names their split (e.g. {sorted(named)[0]}) with files "
            f"that name none ({_examples(unnamed)}): a hash split of the latter would change the named "
            f"valid/test sets. Pass only the named files ({only_named}), or give every file's split in "
            "data.splits, or prepare the unnamed files on their own (hash split)")
    rule = "config" if splits else "named" if named else "hash"
    if require_train and rule != "hash" and "train" not in document_splits:
        found = sorted(set(document_splits))
        raise SplitRuleError(f"split rule {rule!r}: no train document (the inputs give only {found}); "
                             "add the train files, or list them under data.splits.train")
    return rule
