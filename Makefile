# layerplan — two commands on a fresh machine:
#   make demo   set up .venv (pip), install, run the showcase
#   make test   set up .venv (pip), install, run the tests
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build to install first (CPU or CUDA wheels both work; override for another platform).
TORCH ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.layerplan-installed
OUT ?= demo-out
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: setup demo test test-slow test-all bench validate validate-full clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing into $(VENV) (torch from pip; about a minute the first time)"
	@$(PY) -m pip install $(PIP_QUIET) $(TORCH) 2>&1 | grep -v "is ignored: it is neither" || true
	@$(PY) -c "import torch, torchvision" 
	@$(PY) -m pip install $(PIP_QUIET) -e '.[dev]' 2>&1 | grep -v "is ignored: it is neither" || true
	@$(PY) -c "import layerplan.cli"
	@touch $(STAMP)

demo: $(STAMP)
	@bash scripts/demo.sh $(VENV) $(OUT)

test: $(STAMP)
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

test-all: $(STAMP)
	$(PY) -m pytest -m ''

# The closed loop on the emulated cluster (root or an unprivileged user namespace): measured vs predicted.
validate: $(STAMP)
	$(VENV)/bin/layerplan validate --quick --out validate-out

validate-full: $(STAMP)
	$(VENV)/bin/layerplan validate --full --out validate-out

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b; done

clean:
	rm -rf $(VENV) $(OUT) validate-out build *.egg-info src/*.egg-info .pytest_cache
