"""``dynlm data synth``: write the embedded synthetic discourse corpus as CoNLL files;
``dynlm data synth-code``: the synthetic Python corpus of the naming task;
``dynlm data synth-cloze``: the synthetic CBT-format questions of the cloze task;
``dynlm data cloze``: a CBT-style cloze corpus from any corpus (a Ray Data job)."""

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
    code = sub.add_parser(
        "synth-code", help="generate the synthetic Python corpus of the naming task",
        description="Generate Python files of classes whose method names follow from their bodies "
                    "(get_/set_/has_/load_... with noise); input of `dynlm prepare --task naming`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    code.add_argument("--out", required=True, help="folder to write module_*.py into")
    code.add_argument("--num-files", type=int, default=40, help="files to generate")
    code.add_argument("--seed", type=int, default=0, help="generator seed")
    code.set_defaults(func=run_synth_code)
    synth_cloze = sub.add_parser(
        "synth-cloze", help="generate the synthetic CBT-format questions of the cloze task",
        description="Generate CBT-format cloze questions (cbtest_NE_synthetic.txt) whose answer, a made-up "
                    "name, follows from one sentence of the context (chance: 1 in 10 candidates); input of "
                    "`dynlm prepare --config configs/cloze_saw.yaml` (its data.inputs: [cloze]).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    synth_cloze.add_argument("--out", required=True, help="folder to write cbtest_NE_synthetic.txt into")
    synth_cloze.add_argument("--num-questions", type=int, default=2000, help="questions to generate")
    synth_cloze.add_argument("--seed", type=int, default=0, help="generator seed")
    synth_cloze.set_defaults(func=run_synth_cloze)
    cloze = sub.add_parser(
        "cloze", help="build a CBT-style cloze corpus from any corpus (Ray Data)",
        description="Cloze questions from a corpus the LM task reads (CoNLL with gold coreference, plain "
                    "text): 20 context sentences, the next one as the query with one answerable word blanked; "
                    "cbtest_<class>_<split>.txt files, split by document. Input of "
                    "`dynlm prepare --task cloze --set data.named_splits=true`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cloze.add_argument("--input", required=True, nargs="+", help="corpus files or folders")
    cloze.add_argument("--out", required=True, help="folder to write cbtest_*.txt into")
    cloze.add_argument("--seed", type=int, default=0, help="which word of each query is blanked")
    cloze.add_argument("--candidates", type=int, default=10, help="candidates per question")
    cloze.add_argument("--valid-fraction", type=float, default=0.1)
    cloze.add_argument("--test-fraction", type=float, default=0.2)
    cloze.set_defaults(func=run_cloze)


def run_synth(args: argparse.Namespace) -> int:
    from dynlm.data.synth import SynthConfig, write_conll

    cfg = SynthConfig(num_documents=args.num_documents, seed=args.seed, docs_per_file=args.docs_per_file)
    cfg.validate()
    paths = write_conll(cfg, args.out)
    print(f"wrote {cfg.num_documents} documents in {len(paths)} files to {args.out}")
    return 0


def run_synth_code(args: argparse.Namespace) -> int:
    from dynlm.data.synthetic_code import SynthCodeConfig, write_code_corpus

    paths = write_code_corpus(SynthCodeConfig(num_files=args.num_files, seed=args.seed), args.out)
    print(f"wrote {len(paths)} Python files to {args.out}")
    return 0


def run_synth_cloze(args: argparse.Namespace) -> int:
    from dynlm.config import ConfigError
    from dynlm.data.synthetic_cloze import write_synthetic_cbt

    if args.num_questions < 1:
        raise ConfigError(f"--num-questions must be >= 1, got {args.num_questions}")
    path = write_synthetic_cbt(args.out, args.num_questions, seed=args.seed)
    print(f"wrote {args.num_questions} cloze questions to {path}")
    return 0


def run_cloze(args: argparse.Namespace) -> int:
    from dynlm.data.config import DataConfig
    from pipelines.cloze_builder import build_cloze_corpus

    # the split fractions are checked here, before Ray starts (a ConfigError: one line, exit 2)
    DataConfig(inputs=list(args.input), valid_fraction=args.valid_fraction,
               test_fraction=args.test_fraction).validate()
    counts = build_cloze_corpus(DataConfig(inputs=list(args.input)), args.out, seed=args.seed,
                                num_candidates=args.candidates, valid_fraction=args.valid_fraction,
                                test_fraction=args.test_fraction)
    print(f"wrote {sum(counts.values())} cloze questions in {len(counts)} files to {args.out}: "
          + ", ".join(f"{name} {n}" for name, n in counts.items()))
    return 0
