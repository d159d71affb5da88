# Two entry points: `make quickstart` and `make test`. Each creates or refreshes .venv first.
# Beside them: `make lint` (ruff check + format check) and `make test-fast` (unit tests without
# subprocess runs of whole experiments: the tests marked `slow`, tests/conftest.py).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
WORKDIR ?= runs/quickstart
CONFIG ?= experiments/quickstart.py
PYTEST_ARGS ?=

.PHONY: quickstart test test-fast lint format venv venv-test clean sandbox-deps reproduce-env lock

# requirements.lock: the exact versions (with hashes) of the library's dependencies that the
# tables were made with (docs/reproducibility.md). Every venv installs them (as constraints,
# so the test extras resolve around them); `make reproduce-env` also checks their hashes.
LOCK := requirements.lock
CONSTRAINTS := $(VENV)/constraints.txt

# The stamp files re-run pip whenever the package metadata or the lock changes.
$(VENV)/.stamp-base: pyproject.toml setup.py $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	sed -n 's/^\([A-Za-z0-9][^ ]*==[^\\]*\)\\\?$$/\1/p' $(LOCK) > $(CONSTRAINTS)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e .
	touch $@

$(VENV)/.stamp-test: pyproject.toml setup.py $(LOCK) $(VENV)/.stamp-base
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[test]"
	touch $@

# A fresh venv of exactly the locked dependencies, each checked against its hash, then the
# package itself: `.venv-reproduce/bin/python scripts/reproduce.py CONFIG --check`.
REPRO_VENV := .venv-reproduce
reproduce-env:
	test -x $(REPRO_VENV)/bin/python || $(PYTHON) -m venv $(REPRO_VENV)
	$(REPRO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(REPRO_VENV)/bin/python -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(REPRO_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(REPRO_VENV)/bin/python -m pip check

# Rewrites requirements.lock from this venv's versions of pyproject.toml's dependencies (after
# a deliberate upgrade: tables made before it no longer rerun bit for bit).
lock: venv
	$(PY) -m pip install --quiet uv
	$(PY) -m pip freeze --exclude-editable > $(VENV)/freeze.txt
	$(VENV)/bin/uv pip compile pyproject.toml --universal --generate-hashes --python-version 3.11 \
	  --no-header -c $(VENV)/freeze.txt -o $(LOCK)

venv: $(VENV)/.stamp-base
venv-test: $(VENV)/.stamp-test

# The code sandbox (posttrain_jax/rewards/sandbox.py) runs untrusted code under bubblewrap;
# install it when missing (apt-get, with sudo -n when not root). If that cannot be done, say that
# the sandbox falls back to resource limits, and go on: this step never fails the build.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  if command -v apt-get >/dev/null 2>&1; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    $$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -qq >/dev/null 2>&1 && \
	      $$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; \
	  fi; \
	  command -v bwrap >/dev/null 2>&1 || echo "note: bubblewrap (bwrap) is missing and could not \
	be installed; the code sandbox falls back to resource limits only (docs/sandbox.md)"; \
	  true; }

quickstart: venv sandbox-deps
	$(PY) -m posttrain_jax.main --config=$(CONFIG) --workdir=$(WORKDIR)

test: venv-test sandbox-deps
	$(PY) -m pytest -q -n 2 --durations=40 tests $(PYTEST_ARGS)

test-fast: venv-test
	$(PY) -m pytest -q -n 2 -m "not slow" tests $(PYTEST_ARGS)

lint: venv-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv-test
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) runs

# Peer harnesses (scripts/peers/): .venv-trl, .venv-tunix and .venv-verl, each from its pinned
# requirements.
.PHONY: peers peer-trl peer-tunix peer-verl
peers:
	PYTHON=$(PYTHON) bash scripts/peers/setup_peers.sh all
peer-trl:
	PYTHON=$(PYTHON) bash scripts/peers/setup_peers.sh trl
peer-tunix:
	PYTHON=$(PYTHON) bash scripts/peers/setup_peers.sh tunix
peer-verl:
	PYTHON=$(PYTHON) bash scripts/peers/setup_peers.sh verl
