# The two front doors of dlscale (see README):
#   make demo   set up .venv, generate the synthetic ERA5 data set if missing, train the demo ViT
#   make test   set up .venv with the test extras and the example workload package (examples/heat2d), check
#               style (ruff) and run the suite without the tests marked slow (minutes)
#   make test-all   the same with every test (CI runs it)
# and the dependency checks (CONTRIBUTING, "Dependencies"):
#   make test LOCKED=1   the same in .venv-locked, with exactly the versions the suite last passed with
#                        (constraints/tested.txt); also `make demo LOCKED=1`
#   make test-oldest     the whole suite in .venv-oldest, every dependency at the floor pyproject.toml states
#   make lock            rewrite constraints/tested.txt from .venv (after `make test` passed)
# and the documentation site:
#   make docs            install the docs extra into .venv and build the site (docs/, mkdocs.yml) into build/site
PYTHON ?= python3
ifeq ($(LOCKED),1)
VENV ?= .venv-locked
CONSTRAINTS ?= constraints/tested.txt
TEST_ENV ?= DLSCALE_DEPENDENCY_SET=locked:constraints/tested.txt
endif
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch that the development and CI machines carry. On a GPU machine pass the build you
# want (e.g. `make demo TORCH_SPEC=torch`), or install torch into .venv first: an installed torch is kept.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.dlscale-installed
# pip's -c option for a constraints file (none: the newest releases pyproject.toml allows)
CONSTRAINT_OPTION := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
DEMO_DATA ?= data/era5_demo
DEMO_CONFIG ?= demo
LINT_PATHS := $(wildcard src tests benchmarks scripts examples)

.PHONY: demo test test-all lint install clean-venv test-oldest lock docs

install: $(STAMP)

# The example package is installed as a user installs their own workload (its entry point is what the e2e
# tests find it by); it comes after dlscale, which it depends on.
$(STAMP): pyproject.toml examples/heat2d/pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "== keeping the torch already in $(VENV)"; $(BIN)/python -m pip install -q $(CONSTRAINT_OPTION) -e '.[dev]'; \
	else \
		echo "== installing dlscale with $(TORCH_SPEC) into $(VENV) $(CONSTRAINT_OPTION)"; \
		$(BIN)/python -m pip install -q $(CONSTRAINT_OPTION) "$(TORCH_SPEC)" -e '.[dev]'; \
	fi
	$(BIN)/python -m pip install -q $(CONSTRAINT_OPTION) -e examples/heat2d
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

# TEST_ENV tells tests/repository/test_dependencies.py which versions this venv must hold (floors or lock).
# --durations: the slowest tests in every log, so a CI machine's cold caches show where the time goes.
# TEST_WORKERS: pytest-xdist processes, one per core of the 2-core CI machine (each test's torch runs one thread,
# tests/conftest.py); worksteal evens out the long tests. TEST_WORKERS=0 runs the suite in this one process.
# TEST_SELECTION: `make test` leaves out the tests marked slow (4 s or more each on 2 cores: end-to-end runs of the
# commands, forked ranks, torchrun; about 180 of the suite's 2,980 tests and two thirds of its time), so that it
# takes minutes; `make test-all` runs every test, and CI runs it (.ci/run).
TEST_WORKERS ?= 2
TEST_SELECTION ?= -m "not slow"
test: lint
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25 $(TEST_SELECTION)

test-all:
	$(MAKE) test TEST_SELECTION=

# The floors: a constraints file generated from pyproject.toml's lower bounds (torch among them: PyPI's build of
# the floor release, which runs on a CPU too), a venv of its own, the whole suite. The dependency test checks
# that the versions installed are the floors (DLSCALE_DEPENDENCY_SET).
FLOORS := build/floors.txt
test-oldest:
	@mkdir -p build
	$(PYTHON) scripts/dependency_floors.py > $(FLOORS).new
	@cmp -s $(FLOORS).new $(FLOORS) && rm $(FLOORS).new || mv $(FLOORS).new $(FLOORS)
	$(MAKE) test VENV=.venv-oldest CONSTRAINTS=$(FLOORS) TORCH_SPEC=torch TEST_ENV=DLSCALE_DEPENDENCY_SET=floors:$(FLOORS) \
		TEST_SELECTION=

# The versions the suite last passed with, for `make test LOCKED=1` (run after `make test` passed). torch and
# the CUDA packages it brings are left out: a cluster brings its own build (TORCH_SPEC); the torch tested is
# named in the header.
lock: $(STAMP)
	@{ echo "# The versions the suite last passed with (make lock; see CONTRIBUTING, \"Dependencies\")."; \
	   echo "# Tested with $$($(BIN)/python -c 'import sys, torch; print("Python", sys.version.split()[0], "and torch", torch.__version__)')."; \
	   $(BIN)/python -m pip freeze --exclude-editable --all | grep -v -i -E '^(torch|triton|nvidia-|cuda-|pip|setuptools|wheel)[=_-]'; \
	} > constraints/tested.txt.new && mv constraints/tested.txt.new constraints/tested.txt
	@echo "wrote constraints/tested.txt ($$(grep -c '==' constraints/tested.txt) pinned packages)"

# The documentation site: mkdocs with the Material theme, the API page from the docstrings (mkdocstrings).
# --strict turns every warning (a broken link, a page missing from the nav, a docstring that does not render)
# into a failure.
docs: $(STAMP)
	$(BIN)/python -m pip install -q $(CONSTRAINT_OPTION) -e '.[docs]'
	$(BIN)/mkdocs build --strict --site-dir build/site

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

clean-venv:
	rm -rf .venv .venv-locked .venv-oldest
