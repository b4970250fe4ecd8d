PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.yaml

.PHONY: run test lint typecheck check bench bench-everything bench-features docs clean

# Two installs into the one .venv, each marked by a stamp file: the runtime dependencies alone (what
# `make run` needs), and the runtime plus the dev tools (tests, lint, types). Once the dev tools are in,
# `make run` uses that install too. `.venv/bin/python` stands for the dev install (.ci/run builds it).
.venv/bin/python: $(VENV)/.dev

$(VENV)/.dev: pyproject.toml
	@echo "installing the gateway, its runtime dependencies and the dev tools (pytest, ruff, mypy, ...) into $(VENV) (pip's progress follows; only the first time)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	@touch $@

$(VENV)/.runtime: pyproject.toml
	@echo "installing the gateway and its runtime dependencies into $(VENV) (pip's progress follows; the dev tools come with make test)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e .
	@touch $@

## Start the gateway with the shipped config.yaml (in-memory state, no Redis): 127.0.0.1:8080 unless
## `make run PORT=9000 HOST=0.0.0.0` says otherwise (empty: the config's server.port / server.host).
## Variables in a .env beside the config are read too; the environment's own values win.
run: $(if $(wildcard $(VENV)/.dev),$(VENV)/.dev,$(VENV)/.runtime)
	$(BIN)/python -m gateway serve --config $(CONFIG)$(if $(HOST), --host $(HOST))$(if $(PORT), --port $(PORT))

## Regenerate the documents generated from the code: docs/config.md and docs/providers.md.
docs: $(BIN)/python
	$(BIN)/python -m gateway docs
	$(BIN)/python -m providers.matrix > docs/providers.md

## Run the whole test suite: each test file's name as it starts, then a mark per test and the share done;
## skipped tests are listed at the end with their reasons (-rs). `make test PYTEST_ARGS="-x tests/cache"`
## runs one directory (and keeps -rs).
test: $(BIN)/python
	@echo "collecting the tests, then running them file by file (skips and why are listed at the end; docs/testing.md)"
	$(BIN)/python -m pytest -rs $(PYTEST_ARGS)

lint: $(BIN)/python
	$(BIN)/ruff check gateway providers wire tests bench
	$(BIN)/ruff format --check gateway providers wire tests bench

typecheck: $(BIN)/python
	$(BIN)/mypy

check: lint typecheck test

bench: $(BIN)/python
	$(BIN)/python -m bench

# The everything-on rows alone (about eight minutes); written under bench/results/, never over docs/.
bench-everything: $(BIN)/python
	$(BIN)/python -m bench --only everything --json bench/results/everything.json \
		--markdown bench/results/everything.md --plot bench/results/everything.png

# Each feature alone beside nothing on, three rounds each (about eight minutes; also part of `make bench`); under bench/results/.
bench-features: $(BIN)/python
	$(BIN)/python -m bench --only features --json bench/results/features.json \
		--markdown bench/results/features.md --no-plot

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
