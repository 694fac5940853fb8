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
