# clover-local: `make demo` sets everything up and runs the demo; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The reference extra (torch + transformers) cross-checks the numpy reference against
# transformers' qwen3_5_moe. torch is pinned to the CPU build that pip can take from these
# machines' disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: install install-reference test lint demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml patches/build.py $(wildcard patches/*.patch)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python patches/build.py --install
	touch $@

install-reference: install
	$(BIN)/python -m pip install -q '$(TORCH)'
	$(BIN)/python -m pip install -q -e '.[dev,reference]'

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: install
	$(BIN)/python -m clover_local.reference.demo

clean:
	rm -rf $(VENV) build
