"""Data configs: :class:`CorpusConfig` (what every task's ``data:`` section has: the inputs, their
split, where prepared folders go, and the content key of a folder) and :class:`DataConfig`, the
LM task's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from dynlm import storage
from dynlm.config import Config, ConfigError, config_hash
from dynlm.data import fingerprint
from dynlm.data.split import SPLITS, file_split, path_parts

# Bump when the preprocessing code changes its output for the same config (keys prepared folders).
# 2: the key holds the inputs' content listing (dynlm/data/fingerprint.py), not their path strings;
#    inputs that name their split (wiki.train.tokens, development/) keep it instead of a hash split.
# 3: the key names the data config class (the task's); manifests name their task.
# 4: a manifest's split_rule is the rule that split the files (CMRC-2017's hash split said "named").
DATA_FORMAT_VERSION = 4

# Fields that change where/how fast the data is written, not what is written. ``inputs`` is
# replaced by the listing of what the inputs contain.
_NOT_HASHED = ("inputs", "output_root", "num_encode_actors")


@dataclass
class CorpusConfig(Config):
    """The fields every task's data config has (subclass it: ``class MyData(CorpusConfig)``).

    Args:
        inputs: files or folders (a folder is read recursively; hidden files are skipped).
        splits: optional ``{train: [...], valid: [...], test: [...]}``: input paths (files or
            folders, each inside ``inputs``) per split; every input file must be under one. Empty:
            the split comes from the file/folder names (``wiki.train.tokens``, ``development/``)
            or, for unsplit inputs, from a hash of each document id (rules in split.py).
        output_root: prepared folders go to ``<output_root>/<data_hash>/``.
        num_encode_actors: parallelism of the encode step (not part of the hash).
    """

    inputs: list[str]
    splits: dict[str, list[str]] = field(default_factory=dict)
    output_root: str = "runs/prepared"
    num_encode_actors: int = 2
    #: settings added after folders were prepared without them, with the value that means "as
    #: before": they enter the hash only when set to another value, so a folder prepared before
    #: they existed keeps its key
    hashed_when_changed: ClassVar[dict[str, object]] = {}

    def validate(self) -> None:
        if not self.inputs:
            raise ConfigError("inputs: at least one input path is required")
        self._validate_splits()
        if self.num_encode_actors < 1:
            raise ConfigError(f"num_encode_actors: must be >= 1, got {self.num_encode_actors}")

    def _validate_splits(self) -> None:
        """``splits``: known split names, non-empty lists, paths inside ``inputs``, no path in two splits."""
        unknown = sorted(set(self.splits) - set(SPLITS))
        if unknown:
            raise ConfigError(f"splits: unknown split {unknown[0]!r}; known splits: {list(SPLITS)}")
        if self.splits and not self.splits.get("train"):
            raise ConfigError("splits.train: at least one path is required when splits are given")
        inputs = [_absolute_parts(item) for item in self.inputs]
        listed: list[tuple[str, list[str], str]] = []
        for split, paths in self.splits.items():
            if not paths:
                raise ConfigError(f"splits.{split}: give at least one path, or leave the split out")
            for item in paths:
                parts = _absolute_parts(item)
                if not any(parts[: len(root)] == root for root in inputs):
                    raise ConfigError(f"splits.{split}: {item!r} is not inside any of inputs {self.inputs}")
                for other_split, other_parts, other in listed:
                    shorter = min(len(parts), len(other_parts))
                    if other_split != split and parts[:shorter] == other_parts[:shorter]:
                        raise ConfigError(f"splits: {item!r} ({split}) and {other!r} ({other_split}) "
                                          "overlap; a file must be in one split")
                listed.append((split, parts, item))

    def keeps_file(self, relative_path: str) -> bool:
        """Whether the prepare job reads the file at ``relative_path`` (posix, below its input
        folder) of an input folder; a file named in ``inputs`` is always read. Default: every
        file (hidden and ``_``-prefixed ones aside, as Ray Data does). A task's config overrides it."""
        return True

    def file_split(self, path: str) -> tuple[str, str | None]:
        """``(rule, split)`` of one input file (``path`` and this config's ``inputs`` / ``splits``
        resolved alike): ``config`` / ``named`` with its split, or ``hash`` (None: hash each
        document). The parse stage should split by it, and the driver records the job's rule from
        it (:func:`dynlm.data.split.check_split_rule`), so the manifest's ``split_rule`` is the
        rule applied. Default: :func:`dynlm.data.split.file_split`. A task's config overrides it
        when its files give their split another way (or not at all)."""
        return file_split(path, self.inputs, self.splits)

    def input_files(self) -> list[str]:
        """The files the prepare job reads (:func:`dynlm.data.fingerprint.input_files`, filtered
        by :meth:`keeps_file`); the same list keys the folder (:meth:`input_listing`)."""
        return fingerprint.input_files(self.inputs, keep=self.keeps_file)

    def input_listing(self) -> list[list]:
        """``[name, size, digest]`` of every file of :meth:`input_files` (the folder key's inputs)."""
        return fingerprint.input_listing(self.inputs, keep=self.keeps_file)

    def data_hash(self, length: int = 16) -> str:
        """The key of the prepared folder: what the inputs contain + the settings that change
        the output (+ DATA_FORMAT_VERSION).

        The inputs enter by content (:meth:`input_listing`), so a path
        spelled relative, absolute, with ``./`` or through a symlink gives the same key, and a
        changed or added input file a new one. ``output_root`` and ``num_encode_actors`` are
        left out: the same data written elsewhere or with more actors has the same hash.

        Raises:
            FileNotFoundError: an input does not exist.
        """
        return self._hash(exclude=_NOT_HASHED, length=length)

    def encoding_hash(self, length: int = 16) -> str:
        """Hash of what changes the encoded shards. Folders of one encoding hash share their
        shards and differ only in the preprocessor (:meth:`dynlm.tasks.Task.derive_preprocessor`);
        by default that is ``data_hash`` itself (nothing is shared)."""
        return self.data_hash(length)

    def _hash(self, exclude: tuple[str, ...], length: int) -> str:
        as_before = self.hashed_when_changed
        data = {k: v for k, v in self.to_dict().items() if k not in exclude and not (k in as_before and v == as_before[k])}
        data["_inputs"] = self.input_listing()
        # the split paths by what they name, not how they are spelled (./x, x, /abs/x, a link)
        data["splits"] = {split: [storage.absolute(p) for p in paths] for split, paths in self.splits.items()}
        data["_data_format_version"] = DATA_FORMAT_VERSION
        data["_config"] = type(self).__name__  # one task's folder never answers for another's
        return config_hash(data, length)


CORPUS_FIELDS = ("inputs", "splits", "output_root", "num_encode_actors")  # where the data is, not what it becomes


@dataclass
class DataConfig(CorpusConfig):
    """Settings of the preprocessing job (readers -> anonymization -> vocabulary/BPE -> Parquet).

    The :class:`CorpusConfig` fields (``inputs``: ``*.conll``, ``*_conll``, ``*.txt``, ``*.gz``,
    or Parquet files of DOCUMENT_SCHEMA rows; ``splits``, ``output_root``, ``num_encode_actors``)
    come first. Args:
        format: ``conll``, ``text`` or ``auto`` (CoNLL when the text has ``#begin document``).
        vocab_size: number of word types kept (most frequent in the train split), specials excluded.
        gamma: fraction of the vocabulary words on the input short list (ceil).
        bpe_merges: exact number of BPE merges (0 = characters only).
        max_chains: entity identifiers ``<unk1>..<unk{max_chains}>``.
        too_many_chains: ``drop`` documents with more chains, or ``truncate`` (later chains keep words).
        min_chain_mentions: chains with at least this many mentions are anonymized.
        valid_fraction / test_fraction: hash-based split of unsplit inputs' documents (split.py).
        split_seed: seed of that hash.
        lines_per_document: plain text only; >0 cuts documents every that many non-empty lines.
        max_sentence_tokens: >0 cuts every longer sentence into consecutive pieces of at most this
            many tokens, each piece a sentence of its own (0: sentences as the corpus has them).
        max_document_sentences: >0 keeps the first that many sentences of every document (counted
            after ``max_sentence_tokens``), in every split (0: all). Both apply after
            anonymization: a chain's mentions are found in the whole document, so the kept part
            names its entities as the whole document does (the document's chain and mention
            counts are still those of the whole document).
    """

    format: Literal["auto", "conll", "text"] = "auto"
    vocab_size: int = 10000
    gamma: float = 0.9
    bpe_merges: int = 1000
    max_chains: int = 50
    too_many_chains: Literal["drop", "truncate"] = "drop"
    min_chain_mentions: int = 2
    valid_fraction: float = 0.1
    test_fraction: float = 0.1
    split_seed: int = 0
    lines_per_document: int = 0
    max_sentence_tokens: int = 0
    max_document_sentences: int = 0
    hashed_when_changed: ClassVar[dict[str, object]] = {"max_sentence_tokens": 0, "max_document_sentences": 0}

    def encoding_hash(self, length: int = 16) -> str:
        """Hash of what changes the encoded shards: ``data_hash`` without ``gamma``.

        The short list only decides which words keep their own input embedding (applied in the
        model's input layer), so folders that differ only in ``gamma`` share their shards.
        """
        return self._hash(exclude=(*_NOT_HASHED, "gamma"), length=length)

    def validate(self) -> None:
        super().validate()
        if self.vocab_size < 1:
            raise ConfigError(f"vocab_size: must be >= 1, got {self.vocab_size}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma: must be in [0, 1], got {self.gamma}")
        if self.bpe_merges < 0:
            raise ConfigError(f"bpe_merges: must be >= 0, got {self.bpe_merges}")
        if self.max_chains < 1:
            raise ConfigError(f"max_chains: must be >= 1, got {self.max_chains}")
        if self.min_chain_mentions < 1:
            raise ConfigError(f"min_chain_mentions: must be >= 1, got {self.min_chain_mentions}")
        for name in ("valid_fraction", "test_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name}: must be in [0, 1), got {value}")
        if self.valid_fraction + self.test_fraction >= 1.0:
            raise ConfigError(
                f"valid_fraction + test_fraction must be < 1 (no train data left), "
                f"got {self.valid_fraction} + {self.test_fraction}"
            )
        for name in ("lines_per_document", "max_sentence_tokens", "max_document_sentences"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0 (0: off), got {getattr(self, name)}")


def _absolute_parts(path: str) -> list[str]:
    """Components of a URI (scheme dropped) or of a local path made absolute (no file access)."""
    return path_parts(path if "://" in path else os.path.abspath(os.path.expanduser(path)))
