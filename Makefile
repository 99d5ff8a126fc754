# The two commands the README opens with call these targets. Every target installs what it needs
# first, idempotently: `.venv/.installed` is rebuilt only when pyproject.toml or this file change.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed
PYTEST_ARGS ?=
# two workers on the 2-core CI machine (a test file stays on one worker: module fixtures run once)
PYTEST_WORKERS ?= 2

.PHONY: install demo simulate test test-long test-all test-reliability test-soak lint clean docs

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	# torch first and pinned: with 2.13.0 in place nothing later resolves another (CUDA) build.
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	# CrypTen's metadata requires the dead `sklearn` package and torchvision; its real needs are
	# in pyproject.toml, so install it without dependencies.
	$(BIN)/python -m pip install --quiet --no-deps "crypten==0.4.1"
	$(BIN)/python -m mpc_erm.mpc.install_check
	touch $(STAMP)

# Main job: 3 party daemons + a dealer daemon as real processes on loopback (fresh CA, mutual TLS),
# UCI Adult (shipped in the package) split over the parties, one output- and one gradient-
# perturbation job at ε = 1, δ = 1e-5; prints accuracy vs non-private, (ε, δ) spent, wall time.
demo: install
	$(BIN)/mpc-erm demo --out demo-out

# The thesis's seven methods on simulated parties (in-process, no MPC).
# KDD Cup 99 as in the thesis when ../shared/data is there, else scikit-learn's breast-cancer
# (ships with the install; no download).
SIM_DATASET ?= $(shell test -d ../shared/data/kddcup99 && echo kddcup99 || echo breast_cancer)
simulate: install
	$(BIN)/mpc-erm simulate run --dataset $(SIM_DATASET) --parties 100 --iterations 500 \
	    --epsilon 0.5 --delta 1e-3 --lam 1e-3 --conventions exact,thesis --out simulate-out

test: install
	$(BIN)/python -m pytest -m "not slow and not long" -n $(PYTEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS)

# The long campaigns against real daemons that `make test` leaves out (marker `long`: the message
# and file leak searches, owners under faults); CI runs this after `make test`.
test-long: install
	$(BIN)/python -m pytest -m "long and not slow" -n $(PYTEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS)

# Everything, including the slow tests (m = 50,000 parties, full data sets).
test-all: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The long suites: the full fault-injection campaign and the soak (see docs/explanation/reliability.md).
test-reliability: install
	$(BIN)/python -m pytest -m reliability tests/reliability $(PYTEST_ARGS)

test-soak: install
	$(BIN)/python -m pytest -m soak tests/reliability $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check mpc_erm parties coordinator tests benchmarks

# The docs site (mkdocs.yml → site/), warnings as errors. Its tools are pyproject's `docs` extra,
# installed once after the rest (stamp: `.venv/.docs-installed`).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict --site-dir site

$(DOCS_STAMP): $(STAMP) pyproject.toml Makefile
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
