# The two set-up commands: `make run` and `make test`. Both bootstrap .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip
STAMP := $(VENV)/.installed

.PHONY: run test lint format bench-quick clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

$(VENV): $(STAMP)

run: $(STAMP)
	$(BIN)/servedeck up

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-quick: $(STAMP)
	$(BIN)/servedeck bench --preset quick

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
