"""Hyperparameter search, Ray-free: the validated search space (space.py), reading and checking a
``tune_spaces/*.yaml`` file (space_file.py), the JobConfig of each trial (trials.py) and the
results table, CSV and figure of a finished search (report.py). ``pipelines/search_space.py``
turns a space into Ray Tune objects and ``pipelines/tune.py`` runs it.

Modules are imported directly (``from dynlm.search.space import SearchSpace``); this package file
re-exports nothing.
"""
