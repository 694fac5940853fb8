"""``TrainConfig``: how a job trains (the ``train:`` section), read by the training loop
(:mod:`dynlm.training`), the optimizer and schedule (:mod:`dynlm.optim`) and every task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynlm.config import Config, ConfigError


@dataclass
class TrainConfig(Config):
    """How a job trains (the ``train:`` section). The defaults are the best known for the language
    models (``configs/lm_dntm.yaml``: 70-token chunks, a constant rate, ``benchmarks/results/``);
    a task may supply its own (:attr:`dynlm.tasks.base.Task.train_defaults`), which a job's
    ``train:`` section overrides key by key."""

    lr: float = 3e-3
    epochs: int = 5
    batch_size: int = 16  # documents per batch
    bptt_sentences: int = 4  # sentences per truncated-BPTT chunk (one optimizer step), when bptt_tokens is 0
    # > 0: documents are read in chunks of this many input positions (dynlm.data.batching.ChunkLayout;
    # whole sentences for a model that needs them), one optimizer step per chunk, no padding between
    # sentences; 0: sentence lockstep (every sentence of the batch padded to the longest), bptt_sentences a step
    bptt_tokens: int = 70
    # with bptt_tokens > 0: a batch row reads several documents one after the other (the state is reset
    # where one starts), so rows are not padded to the batch's longest document (a model that cannot reset
    # inside a step, the dynamical LM, keeps one document a row). A packed batch holds
    # PACKED_GROUP_BATCHES batches' worth of documents; the progress and fault hooks move per chunk
    # (train_step's after_chunk). Likelihoods are those of one document a row (test_chunked_pass.py)
    pack_documents: bool = True
    grad_clip: float = 0.25  # max global grad norm; 0 disables clipping
    # chunks whose gradients are summed into one optimizer step (the mean of their losses): a k times
    # larger effective batch at the memory of one; on DDP the ranks all-reduce once per optimizer
    # step (no_sync on the others). 1: a step per chunk
    accumulate_steps: int = 1
    weight_decay: float = 0.0
    lr_schedule: Literal["constant", "cosine", "plateau"] = "constant"
    warmup_steps: int = 0
    early_stopping_patience: int = 3  # epochs without validation improvement; 0 disables
    seed: int = 0
    optimizer: Literal["adam", "sgd"] = "adam"

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"train.lr must be positive, got {self.lr}")
        for name in ("epochs", "batch_size", "bptt_sentences", "accumulate_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("grad_clip", "weight_decay", "warmup_steps", "early_stopping_patience", "bptt_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
