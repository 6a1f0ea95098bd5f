# Quick start: `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REPO ?= examples/model_repository
ARGS ?=

.PHONY: serve test lint format bench proto clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,torch]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/tensorgate serve --model-repository $(REPO) $(ARGS)

test: lint
	$(BIN)/python -m pytest -q $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Starts a server on ephemeral ports, drives it, and prints the side-by-side table (see bench/README.md).
bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

# Regenerates the betterproto2 modules in proto/ from proto/*.proto (commit the result; a test checks it).
proto: $(STAMP)
	$(BIN)/python -m proto.generate

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
