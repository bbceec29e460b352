# kvrepro: two commands on a fresh machine.
#   make reproduce   every figure on the embedded defaults (simulator + shipped data)
#   make test        unit tests + notebooks under nbval
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: reproduce test install install-dev lint lab clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[notebooks]'

install-dev: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[notebooks,dev]'

reproduce: install
	$(BIN)/kvrepro reproduce $(ARGS)

test: install-dev
	$(BIN)/ruff check kvrepro tests benchmarks
	$(BIN)/pytest
	$(BIN)/pytest --nbval-lax notebooks/

lint: install-dev
	$(BIN)/ruff check kvrepro tests benchmarks

lab: install
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf runs/ .pytest_cache
