"""The synthetic code corpus (dynlm/data/synthetic_code.py)."""

from __future__ import annotations

import pytest

from dynlm.config import ConfigError
from dynlm.data.python_functions import extract_functions
from dynlm.data.synthetic_code import (
    SynthCodeConfig,
    generate_code_file,
    write_code_corpus,
)


def test_files_are_deterministic_and_independent_of_num_files(tmp_path):
    small = write_code_corpus(SynthCodeConfig(num_files=2, seed=3), tmp_path / "a")
    large = write_code_corpus(SynthCodeConfig(num_files=5, seed=3), tmp_path / "b")
    assert [p.name for p in small] == ["module_000.py", "module_001.py"]
    assert [p.read_text() for p in small] == [p.read_text() for p in large[:2]]
    assert generate_code_file(SynthCodeConfig(seed=4), 0) != generate_code_file(SynthCodeConfig(seed=3), 0)


def test_without_noise_every_name_follows_from_its_body():
    cfg = SynthCodeConfig(num_files=10, name_noise=0.0, body_noise=0.0, camel_case_files=0.0)
    verbs = {"get": "return self._", "set": "self._{} = value", "has": "is not None", "load": "json.load",
             "reset": "= None", "count": "return len(self._"}
    seen = set()
    for index in range(cfg.num_files):
        source = generate_code_file(cfg, index)
        lines = source.split("\n")
        for record in extract_functions(source, f"module_{index}.py"):
            verb, _, field = record["name"].partition("_")
            if record["class_name"] and verb in verbs:
                body = "\n".join(lines[record["lineno"]: record["lineno"] + 2])
                assert verbs[verb].format(field) in body, (record["name"], body)
                assert f"sub:{field.split('_')[0]}" in record["features"]
                seen.add(verb)
            elif verb == "describe":
                assert any(f.startswith("call:get_") for f in record["features"]) or "''" in source
    assert seen == set(verbs)


def test_noise_renames_and_camel_case():
    cfg = SynthCodeConfig(num_files=20, name_noise=0.5, camel_case_files=1.0)
    names = {r["name"] for i in range(cfg.num_files) for r in extract_functions(generate_code_file(cfg, i), "m.py")}
    assert any(name.startswith("fetch") for name in names)
    assert any(name.startswith("get") and name[3:4].isupper() for name in names)


def test_bad_config():
    with pytest.raises(ConfigError, match="name_noise: must be in"):
        SynthCodeConfig(name_noise=1.5).validate()
