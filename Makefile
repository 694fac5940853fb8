# The README's two commands: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run test test-fast lint bench clean

setup:
	@bash scripts/setup_env.sh

## The main job on the embedded defaults: synthetic corpus -> prepare -> train -> register -> evaluate.
run: setup
	$(VENV)/bin/dynlm run

## The whole test suite (what CI runs): the linter, then both tiers as two pytest processes at
## once (scripts/run_tests.sh: the tests on the session's Ray beside all others); each prints
## its 25 slowest tests. PYTEST_ARGS go to both.
test: setup lint
	@bash scripts/run_tests.sh $(PYTEST_ARGS)

## pytest-xdist workers of `make test-fast`.
PYTEST_WORKERS ?= 2

## The unit tier only (no Ray, no subprocess, no server): minutes, for every change.
test-fast: setup
	$(PY) -m pytest -q -m unit -n $(PYTEST_WORKERS) --durations=10 $(PYTEST_ARGS)

## ruff, configured in pyproject.toml.
lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs mlflow.db mlartifacts
