"""Benchmarks: scripts that print measured figures (``results/`` holds their reports).

Run one from the repository root as a module, ``python -m benchmarks.<name> [--help]``, so that
``dynlm``, ``pipelines`` and the shared benchmark modules import by name (nothing is imported by
path). What several benchmarks share lives beside them: :mod:`benchmarks.common` (paths, the
runner over rows held in memory, reports), :mod:`benchmarks.litbank` and
:mod:`benchmarks.wikitext` (the corpora prepared by the library) and
:mod:`benchmarks.plain_stream` (the plain PyTorch LM loop they compare with).
"""
