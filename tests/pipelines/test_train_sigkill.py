"""``dynlm train`` killed with SIGKILL after its first committed checkpoint: ``--resume`` trains the
remaining epoch, registers the model, ends with the weights of an uninterrupted run, and no
process of the killed run's local Ray is left behind.

"Committed" is seen from outside, on the file system: Ray Train's run state
(``checkpoint_manager_snapshot.json``) names ``epoch_0001``. Every run is a real ``dynlm train``
subprocess with its own local Ray under its own ``RAY_TMPDIR``, so a process of a run is any
process whose command line names that folder or that holds a file open under it.

The driver alone is killed (``kill -9 <pid>``): killing its whole process group also kills the
two agents of its raylet that otherwise stay (they share the group); a lone driver's death is
what leaves them, and the next ``dynlm`` start must reap them.

The weights are compared bitwise: on CPU every step is deterministic (the same data order:
Ray Data's ordered split; dropout and batching RNG streams re-seeded from (seed, epoch, rank) at
every epoch, see :mod:`dynlm.training`; the checkpoint holds the weights, optimizer and schedule
state exactly; gloo sums 2 ranks' gradients, a commutative float addition), so a resumed run
repeats the uninterrupted one bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from dynlm.data.synth import SynthConfig, write_conll
from pipelines.ray_env import processes_using
from train_process import committed, output_of, ray_tmp, start_train, stop_and_remove, wait_until

pytestmark = pytest.mark.skipif(
    os.environ.get("DYNLM_SIGKILL_TESTS") != "1",
    reason="SIGKILL-at-a-moment tests race the process they kill: in the full suite on 2 cores they "
           "missed their kill point (2026-12-02); run them with DYNLM_SIGKILL_TESTS=1 until the kill "
           "points are fault-injection hooks instead of polling")


def _weights(run_dir: Path, checkpoint: str) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / checkpoint / "model.pt", weights_only=True)["state_dict"]


def _left_after(folder: Path, seconds: float) -> list[str]:
    """Command lines of the processes still using ``folder`` after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := processes_using(str(folder))) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [command for _, command in left]


@pytest.fixture
def ray_tmps():
    """The RAY_TMPDIRs of the killed, the resumed and the uninterrupted run; whatever still runs
    from them is stopped and the folders are removed at the end, passed or not."""
    folders = [ray_tmp(name) for name in ("killed", "resumed", "straight")]
    yield folders
    for folder in folders:
        stop_and_remove(folder)


@pytest.mark.slow
def test_train_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights(tmp_path, ray_tmps):
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), tmp_path / "synth")
    killed_tmp, resumed_tmp, straight_tmp = ray_tmps
    run_dir = tmp_path / "ray" / "killed"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    process = start_train(tmp_path, "killed", killed_tmp, tracking_uri=uri)
    wait_until(process, lambda: committed(run_dir, "epoch_0001"), "epoch 1's checkpoint is committed")
    os.kill(process.pid, signal.SIGKILL)  # the driver alone, as `kill -9 <pid>` does
    process.wait(timeout=30)
    assert not committed(run_dir, "epoch_0002")  # killed before the last epoch was committed
    # the raylet's dashboard and runtime-env agents outlive it (ray 2.60: they wait on the dead GCS)
    left = _left_after(killed_tmp, 2)

    # the next dynlm start (the resume, another RAY_TMPDIR) reaps what the killed run's Ray left
    text = output_of(start_train(tmp_path, "killed", resumed_tmp, "--resume", tracking_uri=uri))
    if left:
        assert "left by the local Ray of a killed dynlm" in text, (left, text[-3000:])
    assert _left_after(killed_tmp, 10) == []
    assert "[train] registered dynlm-dntm v1" in text, text[-3000:]
    assert _left_after(resumed_tmp, 30) == []  # a run that ends leaves nothing running either

    output_of(start_train(tmp_path, "straight", straight_tmp, "--set", "run.register=false", tracking_uri=uri))
    resumed, straight = _weights(run_dir, "epoch_0002"), _weights(tmp_path / "ray" / "straight", "epoch_0002")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[key], straight[key]) for key in resumed), "resumed weights differ"

    client = MlflowClient(uri)
    version = client.get_model_version_by_alias("dynlm-dntm", "champion")
    run_id = json.loads((run_dir / "dynlm_run.json").read_text())["mlflow_run_id"]
    assert version.run_id == run_id  # the killed run's MLflow run, continued and registered
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "valid_ppl")] == [1, 2]
