"""Why the DNTM's re-appearing-entity perplexity swings between epochs (issue 18).

Trains one row of ``dntm_quality.py`` (same data, split, model and loop) and, after every epoch,
reads the validation (and test) documents once more and splits the NLL of each re-appearing
entity target into two exact parts::

    -log p(<unk_k>) = -log P(any entity id)  +  -log p(<unk_k> | an entity id)
                      "class" part                "which entity" part

It also prints, per epoch: how often the right id is the most likely entity id, the entropy of
the entity-id distribution at those targets, the probability mass the model puts on entity ids
at every other target, the share of the re-appearing NLL that each document carries, and the
norms of the static output vectors of ``<unk1>``...``<unk4>``.

Usage (from the repository root; the issue's size, one row, about 10-12 min on one thread)::

    python -m benchmarks.dntm_swing --epochs 6 --embed-dim 256 --hidden-dim 256 --num-layers 2 \
        --max-sentences 0 --vocab-size 10000 --dropout 0.3 --batch-size 16 --seed 1 --row 'dntm both'
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.dntm_quality import DNTM_ROWS, document_batches, row_job
from benchmarks.dntm_quality import parse_args as quality_args
from benchmarks.litbank import prepare_litbank
from dynlm.data.batching import KIND_REAPPEAR
from dynlm.runner import local_run


@torch.no_grad()
def entity_breakdown(model, batches, spec) -> dict:
    """The split of the re-appearing NLL into class and which-entity parts, over ``batches``."""
    model.eval()
    first, last = spec.entity_offset, spec.entity_offset + spec.num_entities
    sums = {"class": 0.0, "within": 0.0, "right_top": 0, "entropy": 0.0, "n": 0,
            "other_mass": 0.0, "other_n": 0}
    per_doc: dict[str, float] = {}
    for batch in batches:
        state = model.init_state(batch.batch_size)
        for sentence in batch.sentences:
            output, state = model(sentence, state)
            logp = torch.log_softmax(output.padded_logits(float("-inf")).double(), dim=-1)  # [B, L, V]
            entity = logp[..., first:last]  # [B, L, K]
            entity_mass = torch.logsumexp(entity, dim=-1)  # [B, L] log P(any entity id)
            target = sentence.targets
            reappearing = sentence.mask & ((sentence.target_kind & KIND_REAPPEAR) != 0)
            other = sentence.mask & (target < first)
            if other.any():
                sums["other_mass"] += entity_mass[other].exp().sum().item()
                sums["other_n"] += int(other.sum())
            if not reappearing.any():
                continue
            target_logp = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, L]
            within = entity - entity_mass.unsqueeze(-1)  # [B, L, K] log p(id | entity)
            sums["class"] += (-entity_mass[reappearing]).sum().item()
            sums["within"] += (entity_mass - target_logp)[reappearing].sum().item()
            top = within.argmax(-1) + first
            sums["right_top"] += int((top == target)[reappearing].sum())
            sums["entropy"] += (-(within.exp() * within.nan_to_num(neginf=0.0)).sum(-1))[reappearing].sum().item()
            sums["n"] += int(reappearing.sum())
            rows = reappearing.nonzero()[:, 0]
            for row, value in zip(rows.tolist(), (-target_logp[reappearing]).tolist()):
                doc = batch.doc_ids[row] if len(batch.doc_ids) == batch.batch_size else str(row)
                per_doc[doc] = per_doc.get(doc, 0.0) + value
    n = max(sums["n"], 1)
    total = sum(per_doc.values()) or 1.0
    return {
        "reappearing_ppl": round(float(torch.tensor((sums["class"] + sums["within"]) / n).exp()), 2),
        "class_nll": round(sums["class"] / n, 3),
        "which_nll": round(sums["within"] / n, 3),
        "right_id_on_top": round(sums["right_top"] / n, 3),
        "id_entropy": round(sums["entropy"] / n, 3),
        "entity_mass_elsewhere": round(sums["other_mass"] / max(sums["other_n"], 1), 4),
        "reappearing_targets": sums["n"],
        "nll_share_by_doc": {d: round(v / total, 3) for d, v in sorted(per_doc.items(), key=lambda kv: -kv[1])},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", default="dntm both", help="a dntm_quality.py DNTM row, or 'rnn'")
    parser.add_argument("--output", type=Path, default=None, help="write the per-epoch records as JSON")
    own, rest = parser.parse_known_args(argv)
    args = quality_args(rest)
    torch.set_num_threads(args.threads)
    prepared, rows = prepare_litbank(args)
    spec = prepared.spec
    dntm = {"dynamic": "none"} if own.row == "rnn" else DNTM_ROWS[own.row]
    run = local_run(row_job(args, prepared, dntm), prepared)  # the row as dntm_quality.py trains it
    model = run.model
    records = []
    started = time.perf_counter()

    def on_epoch(epoch: int, record: dict) -> None:
        out = {"epoch": epoch, "valid_ppl": round(record["valid_ppl"], 2),
               "valid_ppl_reappearing": round(record["valid_ppl_reappearing"], 2),
               "lr": record["lr"], "minutes": round((time.perf_counter() - started) / 60, 1)}
        for split in ("valid", "test"):
            out[split] = entity_breakdown(model, document_batches(rows[split], spec, args), spec)
        decoder = getattr(model, "lm", model).decoder
        decoder = decoder.weight.detach(), decoder.bias.detach()
        out["unk_norms"] = [round(float(decoder[0][spec.entity_word_id(k)].norm()), 3) for k in range(1, 5)]
        out["unk_biases"] = [round(float(decoder[1][spec.entity_word_id(k)]), 3) for k in range(1, 5)]
        records.append(out)
        print(json.dumps(out), flush=True)
        model.train()

    run.fit(on_epoch=on_epoch)
    if own.output:
        own.output.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
