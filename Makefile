# flightrec: `make demo` runs the whole system on this machine, `make test` runs every test.
# Both set everything up first (virtual environment, Kafka's jars); a second run starts in seconds.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PYTHONSAFEPATH := 1
# Compiled modules are cached (in build/pycache, out of the tree) even where the machine sets PYTHONDONTWRITEBYTECODE:
# without the cache every test worker and every `flightrec` a test starts compiles the package and pytest rewrites
# every test module again (a third of `make check`'s CPU).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX ?= $(CURDIR)/build/pycache
# Kafka's jars (and other downloads) stay in this checkout's .cache, not the user's cache folder.
export FLIGHTREC_CACHE ?= $(CURDIR)/.cache

.PHONY: setup demo test check bench docs clean system-packages device-wheels agent-binary

setup: $(VENV)/.installed .cache/kafka/.fetched

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,test]'
	touch $@

.cache/kafka/.fetched: broker/pom.xml $(VENV)/.installed
	$(VENV)/bin/flightrec broker fetch
	mkdir -p .cache/kafka && touch $@

# Debian tools some tests and benchmarks use (kcat for the delivery baseline, chromium for the browser test,
# postgresql for a lake's catalog, prometheus for promtool, which evaluates the alert rules); installed only when
# missing and when apt can.
system-packages:
	@sh scripts/system-packages.sh

demo: setup
	$(VENV)/bin/flightrec demo

# The whole suite on two workers, each test file on one (each worker starts its own Kafka and PostgreSQL), the
# longest files first (tests/file_seconds.txt; xdist's own order by test count off): docs/contributing.md.
test: setup system-packages
	$(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder

# The edit-test loop, and the first gate of CI (.ci/run): lint, format, types, then every test that needs no broker or
# PostgreSQL (tests using their fixtures are marked integration) and takes under about 3 s (the slower ones are
# marked slow: `make test` runs them), on four workers (many tests wait on real processes, so two per core overlap
# their waits), each test file on one worker. It needs the virtual environment only: no Kafka jars, Java or Maven.
check: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/typecheck.py
	$(VENV)/bin/pytest -q -m "not integration and not slow" -n 4 --dist loadfile --no-loadscope-reorder

# Each benchmark writes its result file (benchmarks/results/<bench>.json); BENCHMARKS.md is rendered from them.
bench: setup system-packages
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
	$(PY) scripts/benchmarks_doc.py

# The agent as one file that needs no Python (PyInstaller onefile; docs/agent-binary.md): dist/flightrec-agent, built
# in a Debian 11 root filesystem with an optimized CPython (glibc >= 2.30; root needed; ~12 min the first time).
agent-binary: setup
	$(PY) scripts/agent_binary.py --portable

docs: setup
	$(PY) -m flightrec.cli.reference > docs/cli.md
	$(PY) -m flightrec.settings > docs/settings.md
	$(PY) scripts/benchmarks_doc.py

# Wheels and pycuda's sdist for scripts/device_run.sh on a GPU machine without PyPI (.cache/device-wheels).
device-wheels: setup
	sh scripts/device_wheels.sh

clean:
	rm -rf $(VENV) .cache .flightrec
