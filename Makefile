# Set-up on a fresh machine is two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

# torch is pinned and installed first: the pinned CPU build is local and fast,
# while an unpinned resolve would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml src/tilescope/trace/_kscan.c src/tilescope/program/_execjson.c src/tilescope/profiler/_filebatch.c \
		src/tilescope/profiler/_lanes.c src/tilescope/program/_native.c \
		src/tilescope/sim/_loop.c
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/tilescope demo

test: setup
	$(PY) -m pytest

bench: setup
	for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build .pytest_cache
