"""`mlflow models serve` of the registered champion: a real server, real HTTP requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_process import BIN_DIR, free_port, post_json, running_server, server_env
from tiny_lm import make_prepared_folder, make_tiny_lm

from dynlm import checkpoint
from dynlm.data.preprocessor import Preprocessor
from dynlm.tasks import lm_serving
from pipelines import tracking
from pipelines.defaults import default_job

REPO = Path(__file__).resolve().parents[2]
TEXT = "the captain saw the zeppelin .\n<unk1> laughed ."


# Bad requests and what the 400's reason must say (the last line of the body's "message").
BAD_REQUESTS = {
    "entity beyond the chains": ({"dataframe_records": [{"text": "<unk999> laughed ."}]},
                                 "document 0: entity token '<unk999>' is beyond max_chains=4"),
    "no text column": ({"dataframe_records": [{"txt": TEXT}]},
                       "the input has no 'text' or 'tokens' column"),
    "empty text": ({"dataframe_records": [{"text": "  "}]}, "document 0 is empty"),
    "lone surrogate": (b'{"dataframe_records": [{"text": "the \\ud800 captain"}]}',
                       "surrogates not allowed"),  # MLflow's own 400 (dynlm's check: test_serving.py)
    "non-UTF-8 bytes": (b'{"dataframe_records": [{"text": "the \xff\xfe captain"}]}',
                        "Ensure that input is a valid JSON formatted string"),
    "malformed JSON": (b'{"dataframe_records": [{"text": ', "Ensure that input is a valid JSON formatted string"),
}


def test_serve_champion_over_http(tmp_path, mlflow_uri, processes):
    (tmp_path / "corpus").mkdir()  # data_hash() reads what the inputs contain
    (tmp_path / "corpus" / "doc.txt").write_text("The cat sat .\n", encoding="utf-8")
    job = default_job([f"data.inputs=[{tmp_path / 'corpus'}]"])
    model, model_cfg, spec, pre = make_tiny_lm(tmp_path / "model", seed=5)
    prepared = make_prepared_folder(tmp_path / "prepared", pre)
    run_id = tracking.start_training_run(job, prepared)
    ckpt = checkpoint.save(tmp_path / "ckpt" / "model.pt", model, model_cfg, spec)
    tracking.finish_training_run(run_id, ckpt.parent, prepared, [{"epoch": 0, "valid_ppl": 20.0}])
    assert tracking.register_and_promote(run_id, 20.0).promoted
    expected = lm_serving.score_documents(model, model_cfg, spec, Preprocessor.load(pre),
                                       lm_serving.parse_input(TEXT))[0]

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [str(BIN_DIR / "mlflow"), "models", "serve", "-m", "models:/dynlm-dntm@champion",
            "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    with running_server(processes, argv, f"{base}/ping", tmp_path / "serve.log", server_env(MLFLOW_TRACKING_URI=mlflow_uri)):
        status, body = post_json(f"{base}/invocations", {"dataframe_records": [{"text": TEXT}]})
        assert status == 200, body
        (prediction,) = body["predictions"]
        assert prediction["tokens"] == ["the", "captain", "saw", "the", "zeppelin", ".", "<eos>",
                                        "<unk1>", "laughed", ".", "<eos>"]
        assert prediction["num_unknown"] == 1  # zeppelin
        assert prediction["token_log_probs"] == pytest.approx(expected["token_log_probs"], abs=1e-6)
        assert prediction["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-6)

        tokens = [line.split() for line in TEXT.splitlines()]
        status, body = post_json(f"{base}/invocations", {"dataframe_records": [{"tokens": tokens}]})
        assert status == 200, body
        assert body["predictions"][0]["token_log_probs"] == pytest.approx(expected["token_log_probs"], abs=1e-6)

        for name, (payload, reason) in BAD_REQUESTS.items():
            status, body = post_json(f"{base}/invocations", payload)
            assert status == 400, (name, body)
            assert reason in body["message"], (name, body)
            assert "stack_trace" not in body and "Traceback" not in json.dumps(body), (name, body)
            assert str(REPO) not in json.dumps(body) and "site-packages" not in json.dumps(body), (name, body)
        status, body = post_json(f"{base}/invocations", {"dataframe_records": [{"text": TEXT}]})
        assert status == 200, body  # the server still answers after every bad request
        assert body["predictions"][0]["token_log_probs"] == pytest.approx(expected["token_log_probs"], abs=1e-6)
