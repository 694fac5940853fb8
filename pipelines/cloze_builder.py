"""``dynlm data cloze``: a CBT-style cloze corpus from any corpus, as a Ray Data job.

    read_binary_files(the LM data config's input files)
    map_batches(the LM task's parse_files)      documents, gold mentions anonymized as <unkN>
    map_batches(dynlm.data.cloze_builder.questions_table)   one CBT block per question + its split
    -> cbtest_<class>_<split>.txt in the output folder (sorted: deterministic bytes)

The output is read by ``dynlm prepare --task cloze --set data.named_splits=true``.
"""

from __future__ import annotations

from pathlib import Path

from dynlm.data import prepared_writer as writer
from dynlm.data.cloze_builder import cbt_files, questions_table
from dynlm.tasks import get_task


def build_cloze_corpus(data_cfg, out: str | Path, *, seed: int = 0, num_candidates: int = 10,
                       valid_fraction: float = 0.1, test_fraction: float = 0.2) -> dict[str, int]:
    """Write the cloze corpus of ``data_cfg``'s inputs (an LM :class:`DataConfig`) into ``out``;
    returns ``{file name: questions}``."""
    import pyarrow as pa
    import ray

    from pipelines.ray_env import init_ray

    init_ray()
    task = get_task("lm")
    resolved = writer.with_absolute_paths(data_cfg)
    files = resolved.input_files()
    if not files:
        raise ValueError(f"data.inputs {data_cfg.inputs}: no input files were found")
    questions = (ray.data.read_binary_files(files, include_paths=True)
                 .map_batches(task.parse_files, batch_format="pyarrow", batch_size=1,
                              fn_kwargs={"cfg_dict": resolved.to_dict()})
                 .map_batches(questions_table, batch_format="pyarrow", batch_size=None,
                              fn_kwargs={"seed": seed, "num_candidates": num_candidates, "valid_fraction": valid_fraction,
                                         "test_fraction": test_fraction, "split_seed": data_cfg.split_seed}))
    tables = list(questions.iter_batches(batch_format="pyarrow", batch_size=None))
    table = pa.concat_tables(tables) if tables else None
    if table is None or table.num_rows == 0:
        raise ValueError(f"data.inputs {data_cfg.inputs}: no document gave a cloze question "
                         "(each question needs 21 sentences)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, text in cbt_files(table).items():
        (out / name).write_text(text, encoding="utf-8")
        counts[name] = text.count("\n\n")
    return counts
