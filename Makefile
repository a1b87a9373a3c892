# Two commands for a fresh machine: `make demo` and `make test`. Each builds .venv on first use.
# PYTHON: the first supported Python found (pyproject's requires-python), else PYTHON=... .
PYTHON ?= $(firstword $(foreach v,3.11 3.12 3.13 3.14,$(shell command -v python$(v) 2>/dev/null)) python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= train,ray,tune,tensorboard,dev,docs
# Exact versions of every dependency of every extra (pip-compile): every install is held to it.
LOCK   ?= requirements.lock
LOCK_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test test-all lint format bench clean venv proto lock

$(BIN)/allocator: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --constraint $(LOCK) --upgrade pip
	$(BIN)/python -m pip install --quiet --constraint $(LOCK) -e ".[$(EXTRAS)]"
	@touch $@

## lock: re-pin requirements.lock from pyproject.toml, keeping pins that still fit
## (LOCK_ARGS=--upgrade moves everything to the newest; torch stays 2.13.0, the CPU build)
lock: venv
	CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --all-extras --strip-extras \
		--no-emit-index-url --no-emit-find-links --unsafe-package allocator \
		--output-file $(LOCK) $(LOCK_ARGS) pyproject.toml

venv: $(BIN)/allocator

## demo: baselines on the embedded S&P 500 data, train the demo config, export, serve, paper-trade it (runs/demo)
demo: venv
	$(BIN)/allocator demo --out runs/demo

## test: lint, then the test suite (slow learning tests too when CI=true). --dist loadfile hands
## whole modules (a module fixture is built once) to whichever worker is free, in collection
## order; with --run-slow the slow modules come first (tests/conftest.py), so the minutes-long
## learning modules spread over both workers instead of queueing on one.
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(if $(filter true,$(CI)),--run-slow,) $(PYTEST_ARGS)

## lint: ruff, then mypy over src/ ([tool.mypy] in pyproject.toml); .pre-commit-config.yaml runs the same
lint: venv
	$(BIN)/ruff check src tests bench scripts deploy studies examples
	$(BIN)/ruff format --check src tests bench scripts deploy studies examples
	$(BIN)/mypy

format: venv
	$(BIN)/ruff check --fix src tests bench scripts deploy studies examples
	$(BIN)/ruff format src tests bench scripts deploy studies examples

bench: venv
	$(BIN)/python bench/env_throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache .hypothesis

## proto: regenerate the gRPC code in src/allocator/serving/proto/v1 from proto/ (commit the result)
proto: venv
	$(BIN)/python scripts/generate_proto.py
