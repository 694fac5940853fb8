"""The embedded default job: the synthetic discourse corpus, a small DNTM, 2 workers, a few epochs.

It finishes in a few minutes on 2 CPU cores, so ``dynlm train`` and ``dynlm run`` work on a
fresh clone with no data and no config file. It is ``configs/lm_dntm.yaml``, one of the job files
per task and model in ``configs/`` that a user copies to start a job of their own
(``dynlm train --config job.yaml``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dynlm.job import JobConfig, with_storage_env

SYNTH_DIR = "runs/synth"

#: Job files a user starts from, one per task and model (``configs/`` at the repository root).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
#: The embedded default job: ``configs/lm_dntm.yaml`` (its data input is ``SYNTH_DIR``).
DEFAULT_JOB_FILE = CONFIG_DIR / "lm_dntm.yaml"
DEFAULT_JOB_YAML = DEFAULT_JOB_FILE.read_text(encoding="utf-8")


def default_job_dict() -> dict:
    """The default job as a plain mapping (a fresh copy every call)."""
    return yaml.safe_load(DEFAULT_JOB_YAML)


def default_job(overrides: list[str] | None = None) -> JobConfig:
    """The embedded default job with ``section.key=value`` overrides applied."""
    return JobConfig.from_dict(default_job_dict()).with_overrides(overrides)


def load_job(path: str | Path | None, overrides: list[str] | None = None) -> JobConfig:
    """A job from a YAML file, or the embedded default when ``path`` is None.

    ``$DYNLM_STORAGE_PATH`` sets ``run.storage_path`` unless an override does
    (:func:`dynlm.job.with_storage_env`).
    """
    overrides = with_storage_env(overrides)
    if path is None:
        return default_job(overrides)
    return JobConfig.from_yaml(path, overrides=overrides)


def ensure_synthetic_corpus(job: JobConfig) -> None:
    """Write the synthetic CoNLL corpus when the job reads ``SYNTH_DIR`` and it is not there yet."""
    from dynlm.data.synth import SynthConfig, write_conll

    for entry in job.data.inputs:
        if Path(entry) == Path(SYNTH_DIR) and not any(Path(entry).glob("*")):
            write_conll(SynthConfig(), Path(entry))
