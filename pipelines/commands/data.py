"""``dynlm data synth``: write the embedded synthetic discourse corpus as CoNLL files."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="data utilities (synthetic corpus)",
                                   description="Data utilities.")
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="<command>")
    synth = sub.add_parser(
        "synth", help="generate the synthetic entity corpus (LitBank-like 13-column CoNLL)",
        description="Generate the synthetic discourse corpus (people re-mentioned by name and "
                    "pronoun, coreference chains annotated) as CoNLL files; input of `dynlm prepare`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    synth.add_argument("--out", required=True, help="folder to write synth_*.conll into")
    synth.add_argument("--num-documents", type=int, default=300, help="documents to generate")
    synth.add_argument("--seed", type=int, default=0, help="generator seed")
    synth.add_argument("--docs-per-file", type=int, default=50, help="documents per CoNLL file")
    synth.set_defaults(func=run_synth)


def run_synth(args: argparse.Namespace) -> int:
    from dynlm.data.synth import SynthConfig, write_conll

    cfg = SynthConfig(num_documents=args.num_documents, seed=args.seed, docs_per_file=args.docs_per_file)
    cfg.validate()
    paths = write_conll(cfg, args.out)
    print(f"wrote {cfg.num_documents} documents in {len(paths)} files to {args.out}")
    return 0
