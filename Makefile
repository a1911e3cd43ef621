# Two entry points for a fresh Linux machine (see README):
#   make quickstart   install, pretrain VICReg on Fashion-MNIST, evaluate beside raw pixels
#   make test         install, run the test suite (the docs site is built and its examples run there too)
#   make docs         build the docs site into site/ (mkdocs serve: a live preview)
#   make mutation     mutation testing of the numeric core (long: hours on 2 cores; not in CI)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH := torch==2.13.0
FMNIST := /usr/share/datasets/fashion-mnist

.PHONY: install data quickstart test test-slow docs mutation clean

install: $(VENV)/.installed

# torch first (CPU wheel), then the package with torch pinned so nothing pulls a CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test,docs]" $(TORCH)
	touch $@

# Fashion-MNIST from the Debian package, where apt is available (root or sudo).
data:
	@if [ -f $(FMNIST)/train-images-idx3-ubyte.gz ]; then exit 0; fi; \
	if command -v apt-get >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	fi; \
	[ -f $(FMNIST)/train-images-idx3-ubyte.gz ] || { echo "Fashion-MNIST not found in $(FMNIST): install the Debian package dataset-fashion-mnist, or put the IDX files in a folder and pass data.root=<folder>"; exit 1; }

quickstart: install data
	$(VENV)/bin/selfsup pretrain configs/fashion_mnist/quickstart.yaml
	$(VENV)/bin/selfsup eval all runs/quickstart --compare raw

# Every core: pytest-xdist workers at one torch thread each; tests marked multiprocess (2 gloo ranks) run alone
# (tests/conftest.py). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= auto
test: install
	@start=$$(date +%s); $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal; rc=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s"; exit $$rc

test-slow: install
	@start=$$(date +%s); $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m slow; rc=$$?; \
	echo "make test-slow: $$(( $$(date +%s) - start )) s"; exit $$rc

docs: install
	$(VENV)/bin/mkdocs build --strict

# One worker: the machines are 2-core and shared. Config in pyproject.toml [tool.mutmut].
# MUTANTS="selfsup.losses.*" restricts the run to matching mutant names.
mutation: install
	$(PY) -m pip install -q -e ".[dev]" $(TORCH)
	$(VENV)/bin/mutmut run --max-children 1 $(MUTANTS)
	$(VENV)/bin/mutmut results
	$(PY) benchmarks/mutation_report.py

clean:
	rm -rf $(VENV) runs/quickstart mutants site
