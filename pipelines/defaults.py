"""The embedded default job: the synthetic discourse corpus, a small DNTM, 2 workers, a few epochs.

It finishes in a few minutes on 2 CPU cores, so ``dynlm train`` and ``dynlm run`` work on a
fresh clone with no data and no config file. ``DEFAULT_JOB_YAML`` is also a template for
hand-written job files (``dynlm train --config job.yaml``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dynlm.job import JobConfig, with_storage_env

SYNTH_DIR = "runs/synth"

DEFAULT_JOB_YAML = f"""\
task: lm                     # dynlm.tasks: the anonymized LM (rnn / dntm / dynamical models)
data:
  inputs: [{SYNTH_DIR}]        # written by `dynlm data synth` (or ensure_synthetic_corpus)
  format: conll
  output_root: runs/prepared
  vocab_size: 2000
  bpe_merges: 200
  max_chains: 20
model:
  type: dntm
  backbone: lstm
  embed_dim: 64
  hidden_dim: 64
  num_layers: 1
  dropout: 0.1
  embedding: word
  dntm:
    dynamic: both
    merge_fn: gru
    new_entity_score: true           # the new-entity logit: first mentions and re-appearing entities
    new_entity_replaces_static: true # at every seed of this size (benchmarks/results/dntm_quality.md)
    adapt_entity_rows: true          # per-document entity rows stepped on the model's errors: every column but first mentions
    entity_row_step: token           # ... also inside a sentence: 42-51 % of re-appearing mentions follow one in the same sentence
train:
  lr: 0.003
  epochs: 4
  batch_size: 8
  bptt_tokens: 70              # chunks of <= 70 tokens (whole sentences for the DNTM); rows packed with documents (pack_documents)
  bptt_sentences: 4            # sentences a step when bptt_tokens is 0 (sentence lockstep)
  grad_clip: 0.25
  lr_schedule: constant        # cosine trailed constant by 10 % at 4 epochs: results/dntm_quality.md
  early_stopping_patience: 3
  seed: 0
run:
  num_workers: 2
  use_gpu: false
  cpus_per_worker: 0.5
  storage_path: runs/ray
  experiment: dynlm
  max_failures: 2
"""


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
