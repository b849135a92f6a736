# polarproxy: `make demo` runs the whole path offline on a CPU; `make test` installs what the tests need and runs them.

VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
HARNESSES := .cache/harnesses
# Harness CLIs the integration tests drive (npm registry; see ../shared/harnesses/README.md).
NPM_HARNESSES := @qwen-code/qwen-code@0.15.10 @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 \
	@google/gemini-cli@0.61.0 opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1

# The newest Python >= 3.12 on this machine (mitmproxy 12 needs 3.12; on 3.11 pip quietly gives mitmproxy 11).
PYTHON ?= $(shell for c in python3.14 python3.13 python3.12 \
	$$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV) python3; do \
	  if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; \
	  then command -v $$c; break; fi; done)

.PHONY: all install demo test test-fast bench lint clean harnesses

all: test

$(STAMP): setup.cfg pyproject.toml
	@if [ -z "$(PYTHON)" ]; then \
	  echo "Error: polarproxy needs Python >= 3.12 (mitmproxy 12 does), and none was found." >&2; \
	  echo "Install one (e.g. 'apt-get install python3.12-venv', 'pyenv install 3.12', or 'uv python install 3.12')," >&2; \
	  echo "or point PYTHON at it: make PYTHON=/path/to/python3.12 test" >&2; exit 1; fi
	@echo "==> creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version))"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[torch,test]'
	@touch $@

install: $(STAMP)

$(HARNESSES)/.installed: Makefile
	@command -v npm >/dev/null 2>&1 || { echo "Error: npm is needed for the harness CLI tests (install Node.js 20+)." >&2; exit 1; }
	mkdir -p $(HARNESSES)
	cd $(HARNESSES) && npm install --no-audit --no-fund --loglevel=error --prefix . $(NPM_HARNESSES)
	@touch $@

harnesses: $(HARNESSES)/.installed

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP) $(HARNESSES)/.installed
	$(PY) -m pytest

# Unit tests only: no subprocesses, no harness CLIs.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not integration"

bench: $(STAMP)
	$(PY) bench/proxy_overhead.py --json bench/results/latest.json

lint: $(STAMP)
	$(PY) -m ruff check polarproxy tests examples bench addons
	$(PY) -m ruff format --check polarproxy tests examples bench addons

clean:
	rm -rf $(VENV) .cache demo-out .pytest_cache
