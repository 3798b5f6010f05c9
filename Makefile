# `make demo` and `make test` work on a fresh machine: they create or refresh .venv themselves and install
# what Spark needs (see setup).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: setup demo test test-fast test-all bench lint

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev,spark]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# Java 17+ and the PostgreSQL JDBC jar for the Spark step and tests: installed with apt-get when missing
# (as root or with passwordless sudo), else one message with the command to run. PGJOURNAL_SKIP_SPARK=1: no Spark.
setup: $(STAMP)
	$(PY) -m pgjournal.spark.system --install

demo: setup
	$(PY) -m pgjournal.cli.demo

# The slowest tests are printed at the end of every run, so the suite's cost stays in sight.
# The suite runs under pytest-xdist in WORKERS processes, each with an embedded server of its own
# (tests/conftest.py), the tests marked `timing` one after another on one worker and the Spark tests in two
# groups of their own (--dist loadgroup). Three workers on two cores: 9.5-11 min where one process took 30
# (bench/results/suite-cost.md); WORKERS=0 runs one process. MARKS: which tests (CI's first pass adds crash_states).
WORKERS ?= 3
MARKS ?= not slow and not crash_states
XDIST = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)
test: setup
	$(PY) -m pytest -q $(XDIST) -m "$(MARKS)" --durations=25

# The database-free subset (tests/conftest.py marks it `unit`): codecs, models, validation, the import order;
# the fuzzers at a tenth of their inputs.
test-fast: setup
	PGJOURNAL_FUZZ_EXAMPLES=0.1 $(PY) -m pytest -q -m "unit and not slow and not spark" --durations=10

test-all: setup
	$(PY) -m pytest -q $(XDIST) -m "" --durations=25

bench: setup
	$(PY) -m pip install -q --disable-pip-version-check -e ".[bench]"
	$(PY) -m bench all --report bench/results/report $(BENCH_ARGS)

# ruff, and mypy --strict over pgjournal/, projections/ and spark/ (settings in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
