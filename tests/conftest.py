"""Shared fixtures: one local Ray per test session, MLflow on SQLite, a moto S3 bucket, the shared corpora."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DYNLM_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray cluster (2 CPUs) shared by every Ray test of the session."""
    import ray

    if not ray.is_initialized():
        # address="local": always a fresh single-node cluster, never one left by another process
        ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    from pipelines.ray_env import claim_address_file

    claim_address_file()  # Train's placement-group cleaner finds this cluster through it
    yield ray
    ray.shutdown()


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A fresh MLflow tracking + registry store on SQLite, artifacts in tmp_path."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DYNLM_MLFLOW_ARTIFACTS", str(tmp_path / "mlartifacts"))
    return uri


@pytest.fixture
def s3_bucket(monkeypatch):
    """A moto S3 server on 127.0.0.1 with a new, empty bucket; yields ``s3://<bucket>/prepared``.

    The bucket's name is new for every test: moto keeps its buckets in process-global state,
    which outlives one server, so a fixed name would show a later test what an earlier one wrote.

    pyarrow reaches it through the AWS environment variables (set for this test only). Skipped
    without the dev extra (moto[server]).
    """
    server_module = pytest.importorskip("moto.server", reason="moto[server] not installed (dev extra)")
    boto3 = pytest.importorskip("boto3")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
        monkeypatch.setenv(key, value)
    bucket = f"dynlm-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/prepared"
    server.stop()


def _shared(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (shared corpora are optional)")
    return path


@pytest.fixture(scope="session")
def litbank_dir() -> Path:
    return _shared("litbank/conll")


@pytest.fixture(scope="session")
def wikitext_dir() -> Path:
    return _shared("wikitext-2")


@pytest.fixture(scope="session")
def cmrc_dir() -> Path:
    return _shared("cmrc2017")


@pytest.fixture(scope="session")
def cbt_dir() -> Path:
    return _shared("cbt_sample")
