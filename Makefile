# The two front doors of dlscale (see README):
#   make demo   set up .venv, generate the synthetic ERA5 data set if missing, train the demo ViT
#   make test   set up .venv with the test extras and the example workload package (examples/heat2d), check
#               style (ruff) and run the whole suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch that the development and CI machines carry. On a GPU machine pass the build you
# want (e.g. `make demo TORCH_SPEC=torch`), or install torch into .venv first: an installed torch is kept.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.dlscale-installed
DEMO_DATA ?= data/era5_demo
DEMO_CONFIG ?= demo
LINT_PATHS := $(wildcard src tests benchmarks scripts examples)

.PHONY: demo test lint install clean-venv

install: $(STAMP)

# The example package is installed as a user installs their own workload (its entry point is what the e2e
# tests find it by); it comes after dlscale, which it depends on.
$(STAMP): pyproject.toml examples/heat2d/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "== keeping the torch already in $(VENV)"; $(BIN)/python -m pip install -q -e '.[dev]'; \
	else \
		echo "== installing dlscale with $(TORCH_SPEC) into $(VENV)"; $(BIN)/python -m pip install -q "$(TORCH_SPEC)" -e '.[dev]'; \
	fi
	$(BIN)/python -m pip install -q -e examples/heat2d
	@touch $(STAMP)

# A finished demo whose config has not changed since is reported without starting Python (a second, not the
# seconds of importing torch and loading the checkpoint); anything else goes to dlscale, which decides.
DEMO_RUN := runs/$(DEMO_CONFIG)/00
demo: $(STAMP)
	@if [ -f $(DEMO_RUN)/summary.json ] && grep -q '"outcome": "finished"' $(DEMO_RUN)/summary.json \
		&& [ $(DEMO_RUN)/summary.json -nt configs/vit_era5.yaml ] && [ -f $(DEMO_DATA)/manifest.json ]; then \
		echo "The demo already finished: its results are in $(DEMO_RUN) (summary.json, figures/, tensorboard/)."; \
		echo "To train it again: rm -r $(DEMO_RUN) && make demo"; \
	else \
		$(BIN)/dlscale data synth-era5 --out $(DEMO_DATA) --preset demo --if-missing && \
		$(BIN)/dlscale train --yaml_config configs/vit_era5.yaml --config $(DEMO_CONFIG); \
	fi

test: lint
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

clean-venv:
	rm -rf $(VENV)
