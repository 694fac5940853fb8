"""Host synchronisations inside a training step (issue 11): one chunk's forward, backward,
clipping and optimizer step of the RNNLM and the DNTM under ``torch.cuda.set_sync_debug_mode``.

On a GPU every operation that makes the host wait for the device (``.item()``, ``int(t)``,
``nonzero``, a copy to the CPU) inside the step is reported with where it happened; the script
exits 1 if there is any. On a CPU it runs the same steps without the check (to test the script).
Needs only torch and the repository (no Ray, no MLflow)::

    python3 -m scripts.sync_check --device cuda     # from the repository root
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

from benchmarks.bench_models import synthetic_rows
from dynlm.data.batching import ChunkLayout, batch_documents
from dynlm.losses import chunk_loss
from dynlm.models import build_model, needs_whole_sentences
from dynlm.models.config import DNTMSettings, ModelConfig
from dynlm.vocab_spec import VocabSpec


def one_step(model, optimizer, chunk, state):
    """What ``dynlm.training.train_step`` does for one chunk, without its end-of-batch sums."""
    optimizer.zero_grad(set_to_none=True)
    outputs, state = model([chunk], state)
    loss, _, _ = chunk_loss(outputs, [chunk])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
    return model.detach_state(state)


def check(name: str, cfg: ModelConfig, spec: VocabSpec, device: torch.device, steps: int) -> bool:
    torch.manual_seed(0)
    model = build_model(cfg, spec).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    layout = ChunkLayout(140 if needs_whole_sentences(cfg) else 35, whole_sentences=needs_whole_sentences(cfg),
                         pack_documents=True)
    batch = next(batch_documents(synthetic_rows(spec, 64, 12, 30), spec, 16, seed=0, layout=layout)).to(device)
    state = one_step(model, optimizer, batch.sentences[0], model.init_state(batch.batch_size, device))  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        for chunk in batch.sentences[1 : 1 + steps]:
            state = one_step(model, optimizer, chunk, state)
    except RuntimeError:
        print(f"[sync] {name}: a host synchronisation inside the step:")
        traceback.print_exc(limit=-6)
        return False
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    print(f"[sync] {name}: {steps} steps, no host synchronisation" if device.type == "cuda"
          else f"[sync] {name}: {steps} steps ran (CPU: nothing checked)")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    spec = VocabSpec(num_words=5000, num_entities=20, shortlist_size=5000, num_subwords=64)
    sizes = dict(embed_dim=128, hidden_dim=128, num_layers=2, dropout=0.3)
    models = {"rnn": ModelConfig(type="rnn", **sizes),
              "dntm both/gru": ModelConfig(type="dntm", dntm=DNTMSettings(dynamic="both", merge_fn="gru"), **sizes)}
    device = torch.device(args.device)
    results = [check(name, cfg, spec, device, args.steps) for name, cfg in models.items()]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
