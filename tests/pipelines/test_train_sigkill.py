"""``dynlm train`` killed with SIGKILL after its first committed checkpoint: ``--resume`` trains the
remaining epoch, registers the model, ends with the weights of an uninterrupted run, and no
process of the killed run's local Ray is left behind.

The kill is the ``train:checkpoint_committed`` point of :mod:`dynlm.faults`: rank 0, at its first
step of epoch 2, waits until Ray Train's run state (``ray.train.Result.from_path``) names
``epoch_0001`` and then SIGKILLs the driver, exactly once and at that moment however loaded the
machine is. The killed and the resumed run are real ``dynlm train`` subprocesses, each with its own
local Ray under its own ``RAY_TMPDIR``, so a process of a run is any process whose command line
names that folder or that holds a file open under it; the uninterrupted reference run is the same
job, a third ``dynlm train`` with a Ray of its own (so the whole test runs beside the session's
Ray: ``scripts/run_tests.sh``).

The driver alone is killed (as ``kill -9 <pid>`` does): killing its whole process group would
also kill the two agents of its raylet that otherwise stay (they share the group). A lone
driver's death leaves them waiting on the dead GCS until Ray's GCS reconnect timeout (60 s)
ends them (the rest of its Ray follows the driver within seconds, longer on a loaded machine);
nothing of the killed run may be left after that timeout
(:data:`train_process.ORPHANED_AGENTS_EXIT_S`), and nobody but Ray stops them.

The weights are compared bitwise: on CPU every step is deterministic (the same data order:
Ray Data's ordered split; dropout and batching RNG streams re-seeded from (seed, epoch, rank) at
every epoch, see :mod:`dynlm.training`; the checkpoint holds the weights, optimizer and schedule
state exactly; gloo sums 2 ranks' gradients, a commutative float addition), so a resumed run
repeats the uninterrupted one bit for bit.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from train_process import (
    ORPHANED_AGENTS_EXIT_S,
    committed,
    left_after,
    output_of,
    ray_tmp,
    start_train,
    stop_and_remove,
)

from dynlm.data.synth import SynthConfig, write_conll


def _weights(run_dir: Path, checkpoint: str) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / checkpoint / "model.pt", weights_only=True)["state_dict"]


@pytest.fixture
def ray_tmps():
    """The RAY_TMPDIRs of the killed, the resumed and the uninterrupted run; whatever still runs
    from them is stopped and the folders are removed at the end, passed or not."""
    folders = [ray_tmp(name) for name in ("killed", "resumed", "straight")]
    yield folders
    for folder in folders:
        stop_and_remove(folder)


def test_train_killed_after_a_checkpoint_resumes_to_the_uninterrupted_weights(tmp_path, ray_tmps, processes,
                                                                              empty_mlflow_db):
    write_conll(SynthConfig(num_documents=24, docs_per_file=12), tmp_path / "synth")
    killed_tmp, resumed_tmp, straight_tmp = ray_tmps
    run_dir = tmp_path / "ray" / "killed"
    shutil.copy(empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    # rank 0 kills the driver (its line goes to the worker's log, not to this output)
    output_of(start_train(processes, tmp_path, "killed", killed_tmp, tracking_uri=uri, kill_at="train:checkpoint_committed"),
              expected_returncode=-signal.SIGKILL)
    assert committed(run_dir, "epoch_0001") and not committed(run_dir, "epoch_0002")
    text = output_of(start_train(processes, tmp_path, "killed", resumed_tmp, "--resume", tracking_uri=uri))
    assert left_after(killed_tmp, ORPHANED_AGENTS_EXIT_S) == []  # Ray's GCS reconnect timeout ended them
    assert "[train] registered dynlm-dntm v1" in text, text[-3000:]
    assert left_after(resumed_tmp, 30) == []  # a run that ends leaves nothing running either

    # the uninterrupted reference: the same job (its prepared folder reused), not registered
    output_of(start_train(processes, tmp_path, "straight", straight_tmp, "--set", "run.register=false",
                          tracking_uri=uri))
    resumed, straight = _weights(run_dir, "epoch_0002"), _weights(tmp_path / "ray" / "straight", "epoch_0002")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[key], straight[key]) for key in resumed), "resumed weights differ"

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # not a registry URI another test set
    version = client.get_model_version_by_alias("dynlm-dntm", "champion")
    run_id = json.loads((run_dir / "dynlm_run.json").read_text())["mlflow_run_id"]
    assert version.run_id == run_id  # the killed run's MLflow run, continued and registered
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "valid_ppl")] == [1, 2]
