# corral: set-up and test harness.
#
#   make demo   create the virtualenv (if needed) and run the demo on SQLite
#   make test   create the virtualenv (if needed), check lint, format and
#               types (ruff, mypy), start a throwaway PostgreSQL on loopback
#               (unless CORRAL_TEST_PG_URL is set), install Debian's chromium
#               (browser tests) and prometheus (promtool) when missing (as
#               root), and run the whole test suite
#   make lint   only the lint, format and type checks
#   make clean  remove the virtualenv and build/test leftovers
#
# Extra pytest arguments: make test PYTEST_ARGS='-k lease -x'
# The suite runs in PYTEST_WORKERS processes (pytest-xdist; most tests wait
# on workers, leases and sleeps, so two pay even on two cores):
#                         make test PYTEST_WORKERS=0  runs it in one process
# Extra demo arguments:   make demo DEMO_ARGS='--hold 60'  (see .venv/bin/corral demo --help)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.corral-installed
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2
DEMO_ARGS ?=

.PHONY: help venv demo lint test screenshots clean

help:
	@echo "make demo   set everything up and run the demo (SQLite)"
	@echo "make test   set everything up, check lint and types, run the whole test suite"
	@echo "make lint   only the lint, format and type checks"
	@echo "make screenshots  refresh docs/screenshots/ from the dashboard's browser tests"
	@echo "make clean  remove the virtualenv and build/test leftovers"

venv: $(STAMP)

# Re-installs whenever pyproject.toml is newer than the stamp; otherwise a no-op.
$(STAMP): pyproject.toml
	@if [ ! -x $(VENV)/bin/python ]; then \
	  echo "make: creating virtualenv in $(VENV)"; \
	  if ! $(PYTHON) -m venv $(VENV); then \
	    rm -rf $(VENV); \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      echo "make: '$(PYTHON) -m venv' failed; installing python3-venv"; \
	      apt-get update -qq </dev/null; \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv </dev/null >/dev/null; \
	      $(PYTHON) -m venv $(VENV); \
	    else \
	      echo "make: '$(PYTHON) -m venv' failed; install the python3-venv package (as root: apt-get install python3-venv)" >&2; \
	      exit 1; \
	    fi; \
	  fi; \
	fi
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

demo: venv
	$(VENV)/bin/corral demo $(DEMO_ARGS)

lint: venv
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy

test: lint
	scripts/ensure-test-tools.sh
	scripts/with-postgres.sh $(VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

screenshots: venv
	scripts/ensure-test-tools.sh
	CORRAL_SCREENSHOTS=$(CURDIR)/docs/screenshots $(VENV)/bin/python -m pytest -q tests/test_dashboard_browser.py

clean:
	rm -rf $(VENV) build .pytest_cache .pgtest
	find . -path ./.git -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -prune -exec rm -rf {} +
