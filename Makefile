# The first two commands of README.md. Both set up .venv (idempotent: a second call only
# re-installs when pyproject.toml changed), check Java, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test soak lint java clean

DEMO := runs/demo

demo: $(STAMP) java
	$(PY) -m cli.main demo --out $(DEMO)

test: $(STAMP) java
	@$(PY) -m pytest -q --durations=20 tests; rc=$$?; \
	  if [ $$rc = 5 ]; then echo 'error: the suite collected no tests' >&2; exit 1; fi; exit $$rc

soak: $(STAMP) java
	$(PY) -m pytest -q -m soak tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

java:
	@bash .ci/ensure-java

clean:
	rm -rf $(VENV) build *.egg-info
