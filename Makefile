# The README's two commands: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run test test-fast lint bench clean

setup:
	@bash scripts/setup_env.sh

## The main job on the embedded defaults: synthetic corpus -> prepare -> train -> register -> evaluate.
run: setup
	$(VENV)/bin/dynlm run

## The whole test suite (what CI runs): the linter, then both tiers; the 25 slowest tests are printed.
test: setup lint
	$(PY) -m pytest -q --durations=25 $(PYTEST_ARGS)

## The unit tier only (no Ray, no subprocess, no server): minutes, for every change.
test-fast: setup
	$(PY) -m pytest -q -m unit --durations=10 $(PYTEST_ARGS)

## ruff, configured in pyproject.toml.
lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs mlflow.db mlartifacts
