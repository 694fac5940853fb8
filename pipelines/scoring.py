"""Scoring a prepared split as a Ray Data job: ``dynlm evaluate`` of a corpus too large for one
process, as a cluster job like training.

The model goes into Ray's object store once, as checkpoint bytes (state_dict + config, rebuilt
with ``weights_only=True``: :func:`dynlm.checkpoint.to_bytes`). ``Scorer`` actors (a pool of
``actors``, one GPU each with ``use_gpu``) load it once each; Ray Data reads the split's Parquet
files and hands every actor blocks of documents, which it evaluates with the task's own
``evaluate_documents`` (the same code, layout and batching as the in-process path) and answers
with the task's metric sums (its accumulator's ``as_tensor``: one row of floats a block). The
driver only adds those rows and computes the metrics from the total
(``task.metrics.from_tensor(...).compute()``). Every document is scored from its start,
independently of the others, so the result equals the in-process evaluation up to float32
rounding (other batches, another order of sums: within 1e-6 relative in the tests).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

#: ``dynlm evaluate --ray-scoring auto`` scores a split larger than this (its uncompressed Arrow
#: size, from the Parquet metadata: ``PreparedData.split_bytes``; a few million tokens) as a Ray
#: Data job; a smaller one is read into the command's process, faster than starting actors.
RAY_SCORING_MIN_BYTES = 64 * 2**20
DOCUMENTS_PER_BLOCK = 256  # documents an actor scores per call (one row of sums comes back)


class Scorer:
    """A Ray Data actor: the model, loaded once from the object store; a block of encoded
    documents in, one row of the task's metric sums out."""

    def __init__(self, model_ref: list, batch_size: int, use_gpu: bool, num_threads: int):
        import ray

        from dynlm.checkpoint import load_bytes

        torch.set_num_threads(num_threads)
        device = "cuda" if use_gpu else "cpu"
        loaded = load_bytes(ray.get(model_ref[0]), map_location=device)  # a list: Ray passes the reference as is
        self.task, self.model, self.model_cfg, self.spec = loaded.task, loaded.model, loaded.model_cfg, loaded.spec
        self.batch_size = batch_size

    def __call__(self, block: pa.Table) -> dict:
        rows = block.to_pylist()  # ragged list columns stay lists, as the in-process path reads them
        metrics = self.task.evaluate_documents(self.model, self.model_cfg, rows, self.spec, self.batch_size)
        sums = self.task.metrics.from_metrics(metrics).as_tensor(torch.device("cpu"))
        return {"sums": sums.numpy()[None, :], "documents": np.array([len(rows)])}


def scores_on_ray(choice: str, prepared, split: str) -> bool:
    """Whether ``--ray-scoring`` ``choice`` (``auto``, ``always``, ``never``) scores ``split``
    of ``prepared`` as a Ray Data job (``auto``: above :data:`RAY_SCORING_MIN_BYTES`)."""
    if choice != "auto":
        return choice == "always"
    return prepared.split_bytes(split) > RAY_SCORING_MIN_BYTES


def actor_layout(actors: int | None = None, use_gpu: bool = False) -> tuple[int, float]:
    """``(actors, CPUs each)`` of a scoring job on the connected Ray: ``actors`` (None: one per
    GPU with ``use_gpu``, else one per CPU); CPU actors share all CPUs but one, whose reservation
    Ray Data's read tasks keep (with every CPU taken by the pool, a read could never start).

    Raises:
        ValueError: ``use_gpu`` on a cluster without GPUs, or fewer than one actor asked for.
    """
    import ray

    from pipelines.ray_env import cluster_cpus

    if actors is not None and actors < 1:
        raise ValueError(f"scoring needs at least one actor, got {actors}")
    if use_gpu:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus == 0:
            raise ValueError("scoring on GPUs: this Ray cluster has no GPU")
        return actors or gpus, 1.0
    cpus = cluster_cpus()[0]
    actors = actors or max(1, int(cpus))
    return actors, max(0.0, cpus - 1.0) / actors


def score_split(task, model, model_cfg, spec, prepared, split: str, *, batch_size: int, actors: int | None = None,
                use_gpu: bool = False) -> tuple[dict, int, str]:
    """The task's metrics of ``model`` on ``split`` of ``prepared``, scored by Ray Data actors
    (module doc; how many: :func:`actor_layout`). Needs a connected Ray
    (:func:`pipelines.ray_env.init_ray`).

    Returns:
        ``(metrics, documents, where)``: ``task.metrics.from_tensor(sum of the blocks' sums).compute()``,
        the number of documents scored, and ``"Ray Data, N CPU|GPU actor(s)"``.

    Raises:
        ValueError: the split has no document; see :func:`actor_layout`.
    """
    import ray
    import ray.data

    from dynlm.checkpoint import to_bytes
    from pipelines.train import read_split

    actors, cpus_per_actor = actor_layout(actors, use_gpu)
    model_ref = ray.put(to_bytes(model, model_cfg, spec, task=task.name))
    scored = read_split(prepared, split).map_batches(
        Scorer, batch_size=DOCUMENTS_PER_BLOCK, batch_format="pyarrow",
        fn_constructor_kwargs={"model_ref": [model_ref], "batch_size": batch_size, "use_gpu": use_gpu,
                               "num_threads": max(1, round(cpus_per_actor))},
        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus_per_actor, num_gpus=1 if use_gpu else 0)
    total, documents = None, 0
    for batch in scored.iter_batches(batch_size=None, batch_format="numpy"):
        part = batch["sums"].sum(axis=0)
        total = part if total is None else total + part
        documents += int(batch["documents"].sum())
    if total is None or documents == 0:
        raise ValueError(f"{prepared.root} [{split}]: no documents to evaluate")
    where = f"Ray Data, {actors} {'GPU' if use_gpu else 'CPU'} actor(s)"
    return task.metrics.from_tensor(torch.from_numpy(total)).compute(), documents, where
