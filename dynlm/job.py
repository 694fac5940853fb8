"""The job config of ``dynlm train``: task + data + model + training + run settings, all strict.

A job is one YAML file (or the embedded default, :mod:`pipelines.defaults`) plus
``section.key=value`` overrides::

    job = JobConfig.from_yaml("job.yaml", overrides=["model.dntm.merge_fn=max", "run.num_workers=1"])
    JobConfig.from_dict({"modle": {}})      # ConfigError: unknown key 'modle'

Missing sections take their defaults, except ``data`` whose ``inputs`` must be given
(:func:`pipelines.defaults.default_job` fills them with the synthetic corpus). ``task`` names the
task (:func:`dynlm.tasks.get_task`: ``lm``, or ``package.module:Class`` for a task outside the
registry); its ``data_config`` and ``model_config`` classes parse the ``data`` and ``model``
sections, so a key of another task's section is an unknown key.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from dynlm import storage
from dynlm.config import Config, ConfigError
from dynlm.tasks import DEFAULT_TASK, get_task
from dynlm.training import TrainConfig

STORAGE_ENV = "DYNLM_STORAGE_PATH"  # run.storage_path of every verb, e.g. s3://bucket/dynlm on a cluster


def with_storage_env(overrides: list[str] | None) -> list[str]:
    """``overrides`` with ``run.storage_path=$DYNLM_STORAGE_PATH`` put first when the variable is
    set and no override names ``run.storage_path``.

    Every verb that builds a job (train, run, tune, retrain) passes its ``section.key=value``
    overrides through here, so the precedence is the same everywhere: a ``--set
    run.storage_path=...`` beats the environment, which beats the job file (and the embedded
    default). The job then records the storage it really used (MLflow logs it).
    """
    overrides = list(overrides or [])
    value = os.environ.get(STORAGE_ENV)
    if value and not any(o.startswith("run.storage_path=") for o in overrides):
        overrides.insert(0, f"run.storage_path={value}")
    return overrides


CACHE_CHOICES = ("auto", "always", "never")  # run.cache_train_split


@dataclass
class RunSettings(Config):
    """Where and how a training job runs (Ray resources, storage, tracking, fault injection).

    Attributes:
        num_workers: Ray Train workers (one DDP rank each).
        use_gpu: one GPU per worker and NCCL; CPU and gloo otherwise.
        bf16: bf16 autocast on GPU workers. Off by default: in the one GPU check so far (see
            benchmarks/results/gpu_h200.md) training diverged under bf16 autocast.
        cpus_per_worker: CPUs reserved per worker (Ray Train's bundle; the worker's torch
            threads: that many, at least one). ``auto``: an equal share of the CPUs the cluster
            has when the run starts, less :data:`INGEST_FREE_CPUS` for Ray Data's ingest (a
            worker group that takes every CPU starves it), whole CPUs when the share holds one
            (:func:`auto_cpus_per_worker`: 0.5 for 2 workers on 2 CPUs, 7 on 16). On a cluster
            whose autoscaler adds nodes later, give a number.
        storage_path: Ray Train storage (checkpoints); shared storage on a multi-node cluster.
            ``$DYNLM_STORAGE_PATH`` replaces the job file's value (:func:`with_storage_env`).
        experiment: MLflow experiment name.
        tracking_uri: MLflow tracking URI (None: $MLFLOW_TRACKING_URI, else ./mlflow.db).
        max_failures: worker-group restarts before the run fails (each resumes from the
            latest checkpoint).
        fail_at_epoch: fault injection: rank ``fail_rank`` raises once in this epoch (-1: off).
        fail_rank: the rank that raises.
        resume: continue the run ``name`` (or the latest run under storage_path) from its
            latest checkpoint.
        register: register the best checkpoint in the MLflow model registry at the end.
        promotion_margin: ``champion`` moves to the new version only if its validation
            perplexity is below ``champion ppl x (1 - promotion_margin)`` (relative; see
            ``dynlm.promotion.promotion_decision``). 0: strictly better.
        name: Ray Train run name (folder under storage_path); None: ``<model type>-<time>``.
        init_checkpoint: warm start: a dynlm checkpoint file (path or URI) whose weights
            initialize the model (optimizer and schedule start fresh); ignored when the run
            restores its own checkpoint. None: random initialization.
        cache_train_split: ``auto``: read the train split's Parquet files once into Ray's object
            store when it takes at most a tenth of it (every epoch then splits cached blocks
            instead of starting a new read: seconds per epoch on a small corpus), else stream
            them every epoch; ``always`` / ``never`` force either.
        system_metrics_s: every this many seconds rank 0 samples its node's CPU, memory, disk
            and network (and GPUs, with ``nvidia-ml-py`` installed) into the MLflow run's system
            metrics (``system/...``, MLflow's monitor); ``dynlm train`` prints their means at
            the end. 0: off.
    """

    num_workers: int = 2
    use_gpu: bool = False
    bf16: bool = False
    cpus_per_worker: float | Literal["auto"] = "auto"
    storage_path: str = "runs/ray"
    experiment: str = "dynlm"
    tracking_uri: str | None = None
    max_failures: int = 2
    fail_at_epoch: int = -1
    fail_rank: int = 1
    resume: bool = False
    register: bool = True
    promotion_margin: float = 0.0
    name: str | None = None
    init_checkpoint: str | None = None
    cache_train_split: str = "auto"
    system_metrics_s: float = 10.0

    def validate(self) -> None:
        if self.cache_train_split not in CACHE_CHOICES:
            raise ConfigError(f"run.cache_train_split must be one of {', '.join(CACHE_CHOICES)}, "
                              f"got {self.cache_train_split!r}")
        if self.num_workers < 1:
            raise ConfigError(f"run.num_workers must be >= 1, got {self.num_workers}")
        if self.system_metrics_s < 0:
            raise ConfigError(f"run.system_metrics_s must be >= 0 (0: off), got {self.system_metrics_s}")
        if self.cpus_per_worker != "auto" and self.cpus_per_worker <= 0:
            raise ConfigError(f"run.cpus_per_worker must be > 0, got {self.cpus_per_worker}")
        if self.max_failures < -1:
            raise ConfigError(f"run.max_failures must be >= -1 (-1: unlimited), got {self.max_failures}")
        if self.fail_at_epoch != -1 and not 0 <= self.fail_rank < self.num_workers:
            raise ConfigError(
                f"run.fail_rank={self.fail_rank} is not a rank of run.num_workers={self.num_workers}"
            )
        if not 0.0 <= self.promotion_margin < 1.0:
            raise ConfigError(f"run.promotion_margin: a fraction of the champion's perplexity in [0, 1), "
                              f"got {self.promotion_margin}")
        if self.name is not None and (not self.name or "/" in self.name or self.name.startswith(".")):
            raise ConfigError(f"run.name {self.name!r} must be a plain folder name")

    def storage_uri(self) -> str:
        """``storage_path`` as Ray wants it: URIs unchanged, local paths made absolute."""
        return storage.absolute(self.storage_path)


# Ray Data's file listing (the first task of every training's ingest) asks for a whole CPU
# whatever the read's own ``num_cpus``: the training workers must leave at least this much free.
INGEST_FREE_CPUS = 1.0


class ResourcesError(ConfigError):
    """The training workers ask for more CPUs or GPUs than the Ray cluster has (a user error)."""


MIN_AUTO_CPUS = 0.1  # the least run.cpus_per_worker=auto gives a worker (then missing_resources says why)


def auto_cpus_per_worker(num_workers: int, cluster_cpus: float, node_cpus: float | None = None,
                         concurrent_runs: int = 1, minimum: float = MIN_AUTO_CPUS) -> float:
    """``run.cpus_per_worker=auto``: CPUs per worker for ``concurrent_runs`` trainings of
    ``num_workers`` workers on ``cluster_cpus`` CPUs (``node_cpus``: the largest node's; a worker
    runs on one node), leaving :data:`INGEST_FREE_CPUS` to Ray Data's ingest.

    A share of at least one CPU is rounded down to whole CPUs (the worker's torch threads), a
    smaller one kept as it is: 0.5 for 2 workers on 2 CPUs, 1 for one worker, 7 for 2 workers
    on 16; at least ``minimum`` (a cluster that may still grow: one CPU, see
    :func:`with_worker_cpus`).
    """
    share = (cluster_cpus - INGEST_FREE_CPUS) / (num_workers * max(concurrent_runs, 1))
    if share >= 1:
        share = float(math.floor(share))
        if node_cpus is not None and node_cpus >= 1:
            share = min(share, float(math.floor(node_cpus)))
    return max(round(share, 3), minimum)


def with_worker_cpus(run: RunSettings, cluster_cpus: float, node_cpus: float | None = None,
                     concurrent_runs: int = 1, *, may_grow: bool = False) -> RunSettings:
    """``run`` with ``cpus_per_worker`` resolved to a number (unchanged when it is one).
    ``may_grow``: a cluster dynlm joined, whose autoscaler may add nodes after the CPUs were
    counted: at least one CPU per worker (its request then asks for real workers)."""
    if run.cpus_per_worker != "auto":
        return run
    return run.replace(cpus_per_worker=auto_cpus_per_worker(
        run.num_workers, cluster_cpus, node_cpus, concurrent_runs, minimum=1.0 if may_grow else MIN_AUTO_CPUS))


def missing_resources(run: RunSettings, cluster_cpus: float, cluster_gpus: float) -> str | None:
    """What the Ray Train workers of ``run`` need that a cluster of ``cluster_cpus`` CPUs and
    ``cluster_gpus`` GPUs lacks, as one line naming the settings that fix it; None when they fit.

    The workers need ``num_workers`` GPUs with ``use_gpu``, and ``num_workers x cpus_per_worker``
    CPUs plus :data:`INGEST_FREE_CPUS` left free for Ray Data's ingest (else it waits forever).
    """
    if run.use_gpu and cluster_gpus < run.num_workers:
        return (f"run.use_gpu asks for {run.num_workers} GPU(s) (one per worker, run.num_workers="
                f"{run.num_workers}) and this Ray has {cluster_gpus:g}: drop --use-gpu "
                "(run.use_gpu=false) or run where the GPUs are")
    auto = " (auto)" if run.cpus_per_worker == "auto" else ""
    run = with_worker_cpus(run, cluster_cpus)
    workers_cpus = run.num_workers * run.cpus_per_worker
    free = cluster_cpus - workers_cpus
    if free < INGEST_FREE_CPUS - 1e-9:
        return (f"run.num_workers={run.num_workers} x run.cpus_per_worker={run.cpus_per_worker:g}{auto} = "
                f"{workers_cpus:g} CPUs leave {free:.2f} of this Ray's {cluster_cpus:g} CPUs free; Ray Data's "
                f"ingest needs {INGEST_FREE_CPUS:g}, so the workers would wait forever: lower "
                "run.num_workers or run.cpus_per_worker")
    return None


@dataclass
class JobConfig(Config):
    """One training job: which task, what to read, what to build, how to train, where to run.

    ``data`` and ``model`` are instances of the task's ``data_config`` / ``model_config``
    (:class:`dynlm.data.config.DataConfig` / :class:`dynlm.models.config.ModelConfig` for ``lm``).
    """

    data: Any
    task: str = DEFAULT_TASK
    model: Any = None
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunSettings = field(default_factory=RunSettings)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, _prefix: str = "") -> "JobConfig":
        data = dict(data or {})
        if "data" not in data:
            raise ConfigError("JobConfig: missing section 'data' (it needs at least data.inputs)")
        if "task" in data and not isinstance(data["task"], str):
            raise ConfigError(f"task: expected a task name, got {data['task']!r}")
        name = data["task"] if "task" in data else DEFAULT_TASK
        try:
            task = get_task(name)
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"task: {exc}") from exc
        for section, config_cls in (("data", task.data_config), ("model", task.model_config)):
            value = data[section] if section in data else {}
            if not isinstance(value, (dict, config_cls)):
                raise ConfigError(f"{section}: expected a mapping for {config_cls.__name__}")
            data[section] = value if isinstance(value, config_cls) else config_cls.from_dict(
                value, _prefix=f"{_prefix}{section}.")
        train = data["train"] if "train" in data else {}
        if isinstance(train, dict):  # the task's best-known settings under the job's own
            data["train"] = {**task.train_defaults, **train}
        return super().from_dict(data, _prefix=_prefix)

    def get_task(self):
        """The :class:`dynlm.tasks.Task` this job trains."""
        return get_task(self.task)

    @property
    def model_type(self) -> str:
        """The model family's short name (``rnn``, ``dntm``, ... for the LM task): the registered
        model is ``dynlm-<model_type>``."""
        return self.get_task().model_name(self.model)

    def training_hash(self) -> str:
        """Hash of everything that changes the trained weights (not where or how it runs)."""
        from dynlm.config import config_hash

        return config_hash({"task": self.task, "data": self.data.data_hash(), "model": self.model.to_dict(),
                            "train": self.train.to_dict()})
