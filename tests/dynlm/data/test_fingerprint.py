"""The prepared-data key follows what the inputs contain, not how their paths are spelled."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from dynlm.data import fingerprint
from dynlm.data.config import DataConfig
from dynlm.data.fingerprint import input_listing


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.conll").write_bytes(b"alpha\n")
    (folder / "sub" / "b.txt").write_bytes(b"beta\n")
    (folder / ".hidden").write_bytes(b"skipped like Ray Data skips it\n")
    (folder / "_SUCCESS").write_bytes(b"")
    return folder


def test_listing_names_sizes_and_content_digests(corpus):
    listing = input_listing([str(corpus)])
    assert [entry[:2] for entry in listing] == [["0:a.conll", 6], ["0:sub/b.txt", 5]]
    assert listing[0][2] == "sha256:" + hashlib.sha256(b"alpha\n").hexdigest()


def test_key_is_the_same_for_every_spelling_of_the_path(corpus, tmp_path, monkeypatch):
    link = tmp_path / "link"
    link.symlink_to(corpus, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    spellings = ["corpus", "./corpus", str(corpus), f"{tmp_path}/./corpus/", "link", f"file://{corpus}"]
    keys = {DataConfig(inputs=[p]).data_hash() for p in spellings}
    assert len(keys) == 1, spellings


def test_changed_or_added_file_gives_a_new_key_and_touch_does_not(corpus):
    cfg = DataConfig(inputs=[str(corpus)])
    before = cfg.data_hash()
    os.utime(corpus / "a.conll", ns=(1, 1))  # touched, same bytes: same key
    assert cfg.data_hash() == before
    (corpus / "a.conll").write_bytes(b"alphA\n")  # one byte changed
    changed = cfg.data_hash()
    assert changed != before
    (corpus / "sub" / "c.txt").write_bytes(b"gamma\n")  # a file added to the folder
    assert cfg.data_hash() not in (before, changed)


def test_unchanged_file_is_hashed_once(corpus, monkeypatch):
    input_listing([str(corpus)])
    calls = []
    monkeypatch.setattr(fingerprint, "_stream_digest", lambda *a: calls.append(a) or "sha256:x")
    input_listing([str(corpus)])
    assert calls == []  # a stat, no read
    (corpus / "a.conll").write_bytes(b"changed\n")
    input_listing([str(corpus)])
    assert len(calls) == 1


def test_same_files_elsewhere_give_the_same_key(corpus, tmp_path):
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(corpus, copy)
    assert DataConfig(inputs=[str(copy)]).data_hash() == DataConfig(inputs=[str(corpus)]).data_hash()


def test_split_paths_enter_the_key_by_what_they_name(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = DataConfig(inputs=["corpus"], splits={"train": ["corpus/a.conll"], "valid": ["corpus/sub"]})
    absolute = DataConfig(inputs=[str(corpus)], splits={"train": [str(corpus / "a.conll")],
                                                         "valid": [str(corpus / "sub")]})
    assert relative.data_hash() == absolute.data_hash()
    swapped = DataConfig(inputs=["corpus"], splits={"train": ["corpus/sub"], "valid": ["corpus/a.conll"]})
    assert swapped.data_hash() != relative.data_hash()
