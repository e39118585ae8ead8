# The two commands of the set-up contract: `make run` and `make test`.
# Each creates .venv if it is missing and installs the project into it first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[analysis,dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/treefed compare

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/broker_throughput.py

clean:
	rm -rf $(VENV) runs reports .pytest_cache
