"""``dynlm tune --json``'s object, from a search's result (the search itself: tests/pipelines/test_tune.py)."""

from __future__ import annotations

import json

from dynlm.promotion import RegistrationResult
from dynlm.search.report import TrialSummary
from pipelines.commands.tune import search_json
from pipelines.tune import SearchResult


def test_the_json_object_holds_every_trial_the_best_and_its_registration():
    trials = [TrialSummary("t0", {"train.lr": 0.01}, "TERMINATED", 41.25, 2, 10.0, "r0", "FINISHED"),
              TrialSummary("t1", {"train.lr": 0.1}, "ERROR", float("nan"), 0, 1.0, None, None, "ValueError: x")]
    registration = RegistrationResult("dynlm-dntm", "3", "promoted", "beats v2", "3")
    result = SearchResult(experiment="s", experiment_path="/runs/ray/s", parent_run_id="p", num_prepared=1,
                          trials=trials, interrupted=False, num_finished=1, best=trials[0],
                          registration=registration, wall_s=12.5)
    out = json.loads(json.dumps(search_json(result)))  # plain JSON: the NaN objective is null
    assert (out["experiment"], out["parent_run_id"], out["num_trials"], out["num_finished"]) == ("s", "p", 2, 1)
    assert out["trials"][1]["best_valid_objective"] is None and out["trials"][1]["error"] == "ValueError: x"
    assert out["best"]["trial_id"] == "t0" and out["best"]["params"] == {"train.lr": 0.01}
    assert out["registration"] == {"name": "dynlm-dntm", "version": "3", "decision": "promoted",
                                   "reason": "beats v2", "champion_version": "3"}
    result.best, result.registration = None, None
    assert search_json(result)["best"] is None and search_json(result)["registration"] is None
