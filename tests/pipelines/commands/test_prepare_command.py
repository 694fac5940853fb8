"""``dynlm prepare``'s data config: the task's defaults, the flags, then ``--set``."""

from __future__ import annotations

import sysconfig

import pytest

from dynlm.config import ConfigError
from pipelines.commands.prepare import load_data_config


def test_a_task_with_default_inputs_needs_no_input():
    task, cfg = load_data_config(None, [], None, ["name_vocab_size=50"], "naming")
    assert task.name == "naming" and cfg.inputs == [sysconfig.get_paths()["stdlib"]] and cfg.name_vocab_size == 50
    task, cfg = load_data_config(None, ["code/"], "out", [], "naming")
    assert cfg.inputs == ["code/"] and cfg.output_root == "out"


def test_the_lm_task_needs_inputs():
    with pytest.raises(ConfigError, match="no inputs: pass --input PATH"):
        load_data_config(None, [], None, [], None)


def test_set_takes_the_data_section_as_train_and_tune_spell_it():
    """The README's cloze command: ``dynlm prepare --task cloze --set data.named_splits=true``."""
    _, cfg = load_data_config(None, ["cbt/"], None, ["data.named_splits=true", "vocab_size=77"], "cloze")
    assert cfg.named_splits is True and cfg.vocab_size == 77
    with pytest.raises(ConfigError, match=r"--set train.epochs=3: dynlm prepare takes data settings only"):
        load_data_config(None, ["x/"], None, ["train.epochs=3"], None)
    with pytest.raises(ConfigError, match="no_such_key"):
        load_data_config(None, ["x/"], None, ["data.no_such_key=1"], None)
