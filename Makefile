# One-command set-up for a fresh machine: a virtualenv in .venv with the CPU build of
# torch that lies on disk (torch==2.13.0; a bare "torch" would pull a multi-GB CUDA build)
# and costaware installed editable with its dev tools.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo predict-demo test lint typecheck bench docs clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/optuna_quickstart.py

predict-demo: $(STAMP)
	$(BIN)/python examples/predict_demo.py

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples docs/_ext
	$(BIN)/mypy
	bash .ci/chromium.sh
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples docs/_ext

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site (mkdocs-material, API pages from docstrings) into site/; the
# tests build it too, with warnings as errors.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/latency.py
	$(BIN)/python benchmarks/memory_check.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
