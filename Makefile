# Two commands for a fresh machine: `make demo` and `make test`. Each builds .venv on first use.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= train,dev
PYTEST_ARGS ?=

.PHONY: demo test test-all lint format bench clean venv proto

$(BIN)/allocator: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	@touch $@

venv: $(BIN)/allocator

## demo: baselines on the embedded S&P 500 data, then train the demo config and export it (runs/demo)
demo: venv
	$(BIN)/allocator demo --out runs/demo

## test: lint, then the test suite (slow learning tests too when CI=true)
test: venv
	$(BIN)/ruff check src tests bench scripts deploy
	$(BIN)/ruff format --check src tests bench scripts deploy
	$(BIN)/python -m pytest -n 2 $(if $(filter true,$(CI)),--run-slow,) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check src tests bench scripts deploy
	$(BIN)/ruff format --check src tests bench scripts deploy

format: venv
	$(BIN)/ruff check --fix src tests bench scripts deploy
	$(BIN)/ruff format src tests bench scripts deploy

bench: venv
	$(BIN)/python bench/env_throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis

## proto: regenerate the gRPC code in src/allocator/serving/proto/v1 from proto/ (commit the result)
proto: venv
	$(BIN)/python scripts/generate_proto.py
