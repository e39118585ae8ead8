# The two commands of the set-up contract: `make run` and `make test`.
# Each creates .venv if it is missing and installs the project into it first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test install bench clean browser strace

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[analysis,dev]'
	touch $(STAMP)

install: $(STAMP)

# First the Spark driver's class archive (treefed/analysis/cds.py: once per JDK and
# pyspark, from a small report; never fails): the report's cold JVM maps the classes.
run: $(STAMP)
	$(BIN)/python -m treefed.analysis.cds
	$(BIN)/treefed compare

# Headless Chromium (a Debian package) renders the report page in
# tests/analysis/test_page.py: installed here when missing and apt-get is usable (root),
# otherwise that test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	    || echo "chromium not installed (apt-get failed): the page-rendering test will skip"; \
	  else echo "chromium not installed (needs root and apt-get): the page-rendering test will skip"; fi; }

# strace (a Debian package) counts the fsyncs SQLite makes in
# tests/persistence/test_ack_sync.py: installed here when missing and apt-get is usable
# (root), otherwise that test skips and says why.
strace:
	@command -v strace >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace; } \
	    || echo "strace not installed (apt-get failed): the fsync-count tests will skip"; \
	  else echo "strace not installed (needs root and apt-get): the fsync-count tests will skip"; fi; }

# Two pytest-xdist workers (tests/conftest.py keeps the Spark tests in one worker and
# tests/worker_ports.py splits the fixed ports): 717-740 s instead of 1,027-1,120 in one
# process on a 2-core machine.
test: $(STAMP) browser strace
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadgroup; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/broker_throughput.py

clean:
	rm -rf $(VENV) runs reports .pytest_cache
