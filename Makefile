# Set-up on a fresh machine is two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench clean

setup: $(STAMP)

# torch is pinned and installed first: the pinned CPU build is local and fast,
# while an unpinned resolve would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml src/tilescope/trace/_kscan.c \
		src/tilescope/program/_native.c \
		src/tilescope/sim/_loop.c
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/tilescope demo

# every tier (unit, device, browser; tests/tiers.py), with the wall time printed at the end
test: setup
	@start=$$(date +%s); $(PY) -m pytest; rc=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s wall, exit code $$rc"; exit $$rc

# the local loop: the unit tier without the slow tests (no simulated device, no browser)
test-fast: setup
	@start=$$(date +%s); $(PY) -m pytest -m "unit and not slow" -q; rc=$$?; \
	echo "make test-fast: $$(( $$(date +%s) - start )) s wall, exit code $$rc"; exit $$rc

# the layer contract, unique module names, ruff and mypy, each held to its recorded baseline (tests/test_layers.py, tests/test_lint.py)
lint: setup
	$(PY) -m pytest -q tests/test_layers.py tests/test_lint.py tests/test_module_names.py

bench: setup
	for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build .pytest_cache
