PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.yaml

.PHONY: run test lint typecheck check bench docs clean

.venv/bin/python: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(BIN)/python

## Start the gateway with the shipped config.yaml (in-memory state, no Redis): 127.0.0.1:8080 unless
## `make run PORT=9000 HOST=0.0.0.0` says otherwise (empty: the config's server.port / server.host).
run: $(BIN)/python
	$(BIN)/python -m gateway serve --config $(CONFIG)$(if $(HOST), --host $(HOST))$(if $(PORT), --port $(PORT))

## Regenerate the documents generated from the code: docs/config.md and docs/providers.md.
docs: $(BIN)/python
	$(BIN)/python -m gateway docs
	$(BIN)/python -m providers.matrix > docs/providers.md

## Run the whole test suite.
test: $(BIN)/python
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(BIN)/python
	$(BIN)/ruff check gateway providers wire tests bench
	$(BIN)/ruff format --check gateway providers wire tests bench

typecheck: $(BIN)/python
	$(BIN)/mypy

check: lint typecheck test

bench: $(BIN)/python
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
