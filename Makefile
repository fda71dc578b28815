# Klear-Reasoner pipeline. Every target sets itself up on a fresh machine (python3 with venv).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast typecheck pipeline bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The whole pipeline, locally, on CPU: the compiled DAG under kfp.local with the tiny preset.
demo: pipeline
	$(BIN)/python -m pipelines.run_local klear-reasoner-demo --workdir runs/demo

# The type check, then every test. pytest exits 5 when it collects nothing; that is not a failure of the suite.
test: typecheck
	$(BIN)/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# The inner loop: everything but the end-to-end runs (marked slow).
test-fast: install
	$(BIN)/python -m pytest -m "not slow"; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

# mypy over every module of the package, the pipelines and the benchmarks (settings in pyproject.toml).
typecheck: install
	$(BIN)/mypy

pipeline: install
	$(BIN)/python -m pipelines.compile

bench: install
	$(BIN)/python benchmarks/bench_curate.py
	$(BIN)/python benchmarks/bench_verifiers.py
	$(BIN)/python benchmarks/bench_gppo_loss.py
	$(BIN)/python benchmarks/bench_gppo_step.py
	$(BIN)/python benchmarks/bench_sft.py

clean:
	rm -rf runs pipelines/compiled .pytest_cache
