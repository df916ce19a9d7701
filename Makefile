# Quick start: `make experiment` and `make test` (each creates .venv first).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test experiment demo bench clean

# Rebuilt when missing or older than the requirements or the package metadata.
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --durations=10 -m "not slow" tests

# The default length-extrapolation study (CPU preset; see configs/copy.py).
experiment: $(STAMP)
	$(BIN)/python -m experiments.length_extrapolation --config=configs/copy.py --workdir=runs/study

# Lesson 7's worked example and shapes, recomputed (its time: README).
demo: $(STAMP)
	$(BIN)/python -m experiments.lesson_demo

clean:
	rm -rf $(VENV) *.egg-info

# Benchmarks (PyTorch comes from requirements-bench.txt); run alone on the machine.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python -m benchmarks.attention
	$(BIN)/python -m benchmarks.block_matmul
	$(BIN)/python -m benchmarks.train_step
	$(BIN)/python -m benchmarks.attention_memory --lengths=1024,4096
	$(BIN)/python -m benchmarks.attention_memory --lengths=16384 --impls=chunked --repeats=1 --out=benchmarks/results/long
