"""The models-from-code pyfunc: save -> load -> predict on raw text and token lists, bad input."""

from __future__ import annotations

import math
import re

import mlflow
import pandas as pd
import pytest
import torch
import yaml
from mlflow.exceptions import MlflowException
from tiny_lm import make_tiny_lm

from dynlm.data.preprocessor import Preprocessor
from dynlm.tasks import lm_serving
from pipelines import tracking

UNSEEN = "the zeppelin glided over the harbour .\n\n<unk1> saw the zeppelin ."


@pytest.fixture
def saved(tmp_path):
    model, model_cfg, spec, preprocessor_path = make_tiny_lm(tmp_path, seed=3)
    path = tracking.save_pyfunc_model(tmp_path / "pyfunc", model, model_cfg, spec, preprocessor_path)
    return path, model, model_cfg, spec, Preprocessor.load(preprocessor_path)


def test_saved_model_is_code_plus_plain_files(saved):
    path = saved[0]
    mlmodel = yaml.safe_load((path / "MLmodel").read_text())
    flavor = mlmodel["flavors"]["python_function"]
    assert flavor["model_code_path"].endswith("pyfunc_model.py")  # models from code
    assert not list(path.rglob("*.pkl")), "no pickled objects"
    assert sorted(p.name for p in (path / "artifacts").iterdir()) == [
        "model.json", "preprocessor.json", "weights.pt"]
    assert (path / "code" / "dynlm" / "models" / "__init__.py").is_file()  # dynlm bundled as code
    # plain tensors, loadable with weights_only=True
    state = torch.load(path / "artifacts" / "weights.pt", weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    assert mlmodel["signature"]["inputs"] and mlmodel["signature"]["outputs"]
    # installable from a package index anywhere: public versions only (this machine's torch is
    # 2.13.0+cpu, a local version label no index serves)
    requirements = [line for line in (path / "requirements.txt").read_text().splitlines() if line]
    assert {re.split("[=<>]", line)[0] for line in requirements} >= {"mlflow", "torch", "tokenizers"}
    assert all("+" not in line for line in requirements), requirements
    # torch: a range from the minor release it was saved with (a GPU host keeps its CUDA build)
    major, minor = torch.__version__.split(".")[:2]
    from packaging.requirements import Requirement  # MLflow writes the specifiers in its own order

    (torch_line,) = [Requirement(line) for line in requirements if line.startswith("torch")]
    assert torch_line.specifier == Requirement(f"torch>={major}.{minor},<{int(major) + 1}").specifier
    assert all("==" in line for line in requirements if not line.startswith("torch")), requirements


def test_predict_raw_text_with_unseen_words(saved):
    path, model, model_cfg, spec, preprocessor = saved
    loaded = mlflow.pyfunc.load_model(str(path))
    out = loaded.predict(pd.DataFrame({"text": [UNSEEN, "the captain smiled ."]}))
    assert list(out.columns) == ["tokens", "token_log_probs", "num_tokens", "num_unknown",
                                 "log_prob", "perplexity"]
    first = out.iloc[0]
    assert list(first["tokens"]) == ["the", "zeppelin", "glided", "over", "the", "harbour", ".",
                                     "<eos>", "<unk1>", "saw", "the", "zeppelin", ".", "<eos>"]
    assert first["num_tokens"] == 14
    assert first["num_unknown"] == 4  # zeppelin x2, glided, over: never seen in training
    log_probs = list(first["token_log_probs"])
    assert all(lp < 0 for lp in log_probs)
    assert first["log_prob"] == pytest.approx(sum(log_probs))
    assert first["perplexity"] == pytest.approx(math.exp(-sum(log_probs) / 14))
    # same numbers as the in-memory model: the pyfunc reloaded the exact weights
    expected = lm_serving.score_documents(model, model_cfg, spec, preprocessor, lm_serving.parse_input(UNSEEN))[0]
    assert log_probs == pytest.approx(expected["token_log_probs"], abs=1e-6)
    # and a differently initialised model scores differently (the check can fail)
    other, *_ = make_tiny_lm(path.parent / "other", seed=4)
    different = lm_serving.score_documents(other, model_cfg, spec, preprocessor, lm_serving.parse_input(UNSEEN))[0]
    assert different["log_prob"] != pytest.approx(first["log_prob"], abs=1e-3)


def test_token_lists_equal_raw_text(saved):
    loaded = mlflow.pyfunc.load_model(str(saved[0]))
    tokens = [line.split() for line in UNSEEN.splitlines() if line.strip()]
    by_tokens = loaded.predict(pd.DataFrame({"tokens": [tokens]})).iloc[0]
    by_text = loaded.predict(pd.DataFrame({"text": [UNSEEN]})).iloc[0]
    assert list(by_tokens["tokens"]) == list(by_text["tokens"])
    assert list(by_tokens["token_log_probs"]) == pytest.approx(list(by_text["token_log_probs"]))


@pytest.mark.parametrize("frame, message", [
    (pd.DataFrame({"text": ["the captain .", "  \n \n"]}), "document 1 is empty"),
    (pd.DataFrame({"text": [""]}), "document 0 is empty"),
    (pd.DataFrame({"tokens": [[[], []]]}), "document 0 is empty"),
    (pd.DataFrame({"text": pd.Series([], dtype=str)}), "no documents"),
])
def test_empty_input_is_a_clear_error(saved, frame, message):
    loaded = mlflow.pyfunc.load_model(str(saved[0]))
    with pytest.raises(MlflowException, match=message):
        loaded.predict(frame)


def test_predict_has_type_hints_so_logging_warns_nothing(tmp_path):
    """MLflow warns at every log of a pyfunc whose ``predict`` has no type hints; ``pd.DataFrame`` in
    and out is a hint it accepts without inferring a schema (the logged signature stays the schema)."""
    import warnings

    model, model_cfg, spec, preprocessor_path = make_tiny_lm(tmp_path, seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = tracking.save_pyfunc_model(tmp_path / "pyfunc", model, model_cfg, spec, preprocessor_path)
        mlflow.pyfunc.load_model(str(path))
    assert not [w for w in caught if "type hint" in str(w.message).lower() and "predict" in str(w.message)], \
        [str(w.message) for w in caught]


def test_the_logged_requirements_resolve_from_a_package_index(saved, processes, tmp_path):
    """The model's environment as `mlflow models serve` / `build-docker` would start to build it:
    pip finds a release of every line of its requirements.txt on the package index this
    machine's pip is configured with (PyPI, or a mirror), installing nothing. Regression: a local
    version label (`torch==2.13.0+cpu`) that no index serves. `--no-deps`: the packages' own
    dependencies are theirs to declare (a full resolve here took 30 s of the suite's CPU)."""
    import json
    import sys

    report = tmp_path / "report.json"
    done = processes.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                          "--report", str(report), "-r", str(saved[0] / "requirements.txt")],
                         timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    for line in (saved[0] / "requirements.txt").read_text().split():
        name = re.split("[=<>]", line)[0].lower()
        assert name in resolved, (name, sorted(resolved))
    major = int(torch.__version__.split(".")[0])
    assert int(resolved["torch"].split(".")[0]) == major  # a release of the range, from an index
