# tickwire: `make test` and `make demo` bootstrap everything they need into .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: test test-fast test-slow lint typecheck soak demo serve bench java-check browser-deps regen clean

$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# setuptools warns that the folder tickwire/ has the package's name: it is the package's own folder
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install --quiet -e '.[test,dev,interop,spark,web]'
	@touch $(STAMP)

java-check:
	@if command -v java >/dev/null 2>&1; then java -version 2>&1 | head -1; \
	else echo "java: not found (needed for Spark and the Deephaven interop tests; install a JDK 17, e.g. apt-get install openjdk-17-jre-headless)"; fi
	@command -v javac >/dev/null 2>&1 || echo "javac: not found (Spark checkpoints fall back to RawLocalFileSystem, ~50 ms a micro-batch instead of ~20; apt-get install openjdk-17-jdk-headless)"

## browser-deps: Debian's chromium for the browser interop tests (tests/test_browser.py), installed
## with apt-get when missing and we are root; never fails: otherwise it says why and those tests skip
browser-deps:
	@if [ -n "$$TICKWIRE_CHROMIUM" ] || command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "chromium: not found and no apt-get to install it (the browser tests will skip)"; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "chromium: not found and not root (sudo apt-get install chromium; the browser tests will skip)"; \
	else \
		echo "chromium: installing Debian's chromium package"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends chromium >/dev/null \
		|| { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
		|| echo "chromium: apt-get install failed (the browser tests will skip)"; \
	fi

## lint: ruff over everything, then the type checker (make test runs it first)
lint: $(STAMP)
	$(PY) -m ruff check .
	@$(MAKE) --no-print-directory typecheck

## typecheck: mypy over the tickwire package (strict on the protocol and the engine: pyproject.toml).
## The package's subpackages live in top-level folders (setup.py maps them), which mypy cannot map:
## it reads them through a tree of links in build/typecheck.
TYPECHECK := build/typecheck
typecheck: $(STAMP)
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/tickwire
	@for f in tickwire/*.py tickwire/py.typed; do ln -s ../../../$$f $(TYPECHECK)/tickwire/; done
	@for d in protocol server clients; do ln -s ../../../$$d $(TYPECHECK)/tickwire/$$d; done
	cd $(TYPECHECK) && ../../$(PY) -m mypy --config-file ../../pyproject.toml -p tickwire

## test: lint, then everything, slow interop tests included (this is what CI runs), on two workers
## (tests/conftest.py keeps a module on one worker and the Deephaven interop modules together)
XDIST ?= -n 2 --dist loadfile
test: $(STAMP) java-check browser-deps lint
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

## test-fast: skip the tests marked slow
test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

## test-slow: only the slow interop tests
test-slow: $(STAMP) java-check browser-deps
	$(PY) -m pytest $(XDIST) -m slow $(PYTEST_ARGS)

## soak: the long random runs `make test` runs briefly: the randomized convergence suite with 20x
## the steps and every seed, the request fuzzer for 10x its budget, every seed of the random graph
## tests and the twelve-kill crash test, then the demo under every kind of client for an hour
## (bench/soak_demo.py, SOAK_MINUTES=N for longer; its report in soak-report.json)
soak: $(STAMP)
	TICKWIRE_SOAK=20 $(PY) -m pytest -m slow tests/test_convergence.py $(PYTEST_ARGS)
	TICKWIRE_SOAK=10 $(PY) -m pytest -m slow -s tests/test_fuzz_requests.py $(PYTEST_ARGS)
	TICKWIRE_SOAK=2 $(PY) -m pytest tests/test_graph_tables.py tests/test_graph_cycles.py tests/test_graph_ops.py \
		tests/test_durability_crash.py $(PYTEST_ARGS)
	$(PY) bench/soak_demo.py --minutes $(or $(SOAK_MINUTES),60) --report soak-report.json

## demo: the demo server; `make demo PORT=10001 HOST=0.0.0.0 ARGS="--psk KEY"` (or TICKWIRE_* variables)
demo: $(STAMP) java-check
	$(PY) -m tickwire demo $(if $(PORT),--port $(PORT)) $(if $(HOST),--host $(HOST)) $(ARGS)

## serve: `tickwire serve` without activating the venv; `make serve PORT=10001 ARGS="--data-dir /tmp/tw"`
serve: $(STAMP)
	$(PY) -m tickwire serve $(if $(PORT),--port $(PORT)) $(if $(HOST),--host $(HOST)) $(ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py

## regen: regenerate the committed flatbuffer code from flatbuffers/*.fbs
regen: $(STAMP)
	$(PY) flatbuffers/generate.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis .ruff_cache .mypy_cache
