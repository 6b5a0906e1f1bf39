# clover-local: `make demo` sets everything up and runs the demo; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The reference extra (torch + transformers) cross-checks the numpy reference against
# transformers' qwen3_5_moe. torch is pinned to the CPU build that pip can take from these
# machines' disk; an unpinned torch would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: install install-reference browser test lint demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml patches/build.py $(wildcard patches/*.patch)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,server]'
	$(BIN)/python patches/build.py --install
	touch $@

install-reference: install
	$(BIN)/python -m pip install -q '$(TORCH)'
	$(BIN)/python -m pip install -q -e '.[dev,server,reference]'

# Debian's Chromium and its driver: tests/test_server.py drives the `clover serve` page in them
# (headless; no browser download). Needs root (apt); the page test skips without them.
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The demo: generate a small Clover checkpoint, convert it to Q8_0 with clover-convert, show the
# file, then a scripted two-turn chat and a visual generation through the patched llama.cpp, and
# last the numpy reference's pass-by-pass trace of the same model (positions filled per pass).
DEMO := build/demo
demo: install
	test -f $(DEMO)/checkpoint/config.json || $(BIN)/python -m clover_local.testing.make_checkpoint $(DEMO)/checkpoint --preset tiny
	test -f $(DEMO)/clover-tiny-Q8_0.gguf || $(BIN)/clover-convert $(DEMO)/checkpoint -o $(DEMO)/clover-tiny-Q8_0.gguf --outtype q8_0
	$(BIN)/clover info $(DEMO)/clover-tiny-Q8_0.gguf
	printf 'Hello there!\n/think off\nWhat is a clover?\n' | $(BIN)/clover chat $(DEMO)/clover-tiny-Q8_0.gguf -n 48
	$(BIN)/clover generate $(DEMO)/clover-tiny-Q8_0.gguf -p "Write a haiku about clover." -n 64 --visual
	$(BIN)/python -m clover_local.reference_demo --checkpoint $(DEMO)/checkpoint --max-new-tokens 32

clean:
	rm -rf $(VENV) build
