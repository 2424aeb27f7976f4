# Two commands for a fresh clone: `make start` and `make test`.
# Both create the virtual environment on first use (scripts/install.sh).

VENV   ?= .venv
PYTHON ?= python3
ARGS   ?=
# Two workers (the cores here); worksteal: a worker that runs out takes tests queued for
# the other, so no worker idles while the other ends a queue of node tests (development.md).
# The 15 slowest tests are listed at the end, so a CI log shows where the time went.
PYTEST_ARGS ?= -m "not slow and not gpu" -n 2 --dist worksteal --durations=15
STAMP  := $(VENV)/.installed

.PHONY: start test test-slow test-all lint bench clean-venv

$(STAMP): pyproject.toml scripts/install.sh
	VENV=$(VENV) PYTHON=$(PYTHON) sh scripts/install.sh
	touch $@

start: $(STAMP)  ## start a node on the embedded model; options via ARGS="..."
	$(VENV)/bin/sapo-node start $(ARGS)

test: $(STAMP)  ## unit and integration tests (no slow, no GPU)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-slow: $(STAMP)  ## the embedded real model end to end (minutes on a CPU)
	$(VENV)/bin/python -m pytest -m slow

test-all: $(STAMP)
	$(VENV)/bin/python -m pytest -m "not gpu"

lint: $(STAMP)
	$(VENV)/bin/ruff check sapo_node tests scripts
	$(VENV)/bin/ruff format --check sapo_node tests scripts

bench: $(STAMP)  ## generation-path, wire and pool benchmarks (docs/benchmarks.md)
	$(VENV)/bin/python scripts/bench_round.py
	$(VENV)/bin/python scripts/bench_pool.py

clean-venv:
	rm -rf $(VENV)
