# Two entry points: `make quickstart` and `make test`. Each creates or refreshes .venv first.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
WORKDIR ?= runs/quickstart
CONFIG ?= experiments/quickstart.py
PYTEST_ARGS ?=

.PHONY: quickstart test venv venv-test clean

# The stamp files re-run pip whenever setup.py changes.
$(VENV)/.stamp-base: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.stamp-test: setup.py $(VENV)/.stamp-base
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

venv: $(VENV)/.stamp-base
venv-test: $(VENV)/.stamp-test

quickstart: venv
	$(PY) -m posttrain_jax.main --config=$(CONFIG) --workdir=$(WORKDIR)

test: venv-test
	$(PY) -m pytest -q -n 2 tests $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs

# Peer harnesses (scripts/peers/): .venv-trl and .venv-tunix, each from its pinned requirements.
.PHONY: peers peer-trl peer-tunix
peers:
	PYTHON=$(PYTHON) bash scripts/peers/setup_peers.sh all
peer-trl:
	PYTHON=$(PYTHON) bash scripts/peers/setup_peers.sh trl
peer-tunix:
	PYTHON=$(PYTHON) bash scripts/peers/setup_peers.sh tunix
