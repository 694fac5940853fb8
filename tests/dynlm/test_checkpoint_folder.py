"""Which file of a checkpoint folder is the checkpoint."""

from __future__ import annotations

import pytest

from dynlm.checkpoint_folder import find_checkpoint_file


def test_model_pt_else_the_only_pt_file(tmp_path):
    (tmp_path / "other.pt").write_bytes(b"")
    assert find_checkpoint_file(tmp_path) == tmp_path / "other.pt"
    assert find_checkpoint_file(tmp_path / "other.pt") == tmp_path / "other.pt"  # a file is itself
    (tmp_path / "model.pt").write_bytes(b"")
    assert find_checkpoint_file(str(tmp_path)) == tmp_path / "model.pt"


def test_missing_or_ambiguous(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_checkpoint_file(tmp_path / "nowhere")
    (tmp_path / "a.pt").write_bytes(b"")
    (tmp_path / "b.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"must hold model.pt or exactly one \*.pt file"):
        find_checkpoint_file(tmp_path)
