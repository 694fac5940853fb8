# The README's two commands: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup run test bench clean

setup:
	@bash scripts/setup_env.sh

## The main job on the embedded defaults: synthetic corpus -> prepare -> train -> register -> evaluate.
run: setup
	$(VENV)/bin/dynlm run

## The whole test suite (what CI runs).
test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs mlflow.db mlartifacts
