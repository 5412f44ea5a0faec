# Quickstart: `make train` and `make test`. Both create .venv and install on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install train test test-fast lint format bench notebooks docs clean

# uv installs the same packages as pip (same resolution from setup.py) in about half the time:
# it downloads and unpacks in parallel. --compile-bytecode writes the .pyc files that pip also
# writes, so that no process compiles TensorFlow's sources when it imports them. Where uv cannot
# be installed or fails, pip does the install.
$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	($(PY) -m pip install -q uv && $(PY) -m uv pip install -q --compile-bytecode \
		--python $(PY) -e '.[test]') || \
		{ echo "uv failed; installing with pip" >&2; $(PY) -m pip install -q --upgrade pip && \
		$(PY) -m pip install -q -e '.[test]'; }
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) -m tfdist train

# Runs every test, the slow multi-process ones included. pytest's exit code 5
# ("no tests collected") counts as a failure here: the suite must run tests.
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadscope $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not multiprocess and not fault and not notebook" $(PYTEST_ARGS)

# Ruff (ruff.toml): formatting and lint, line length 100. `make format` rewrites in place.
lint: $(STAMP)
	$(PY) -m ruff format --check --diff tfdist tests
	$(PY) -m ruff check tfdist tests

format: $(STAMP)
	$(PY) -m ruff format tfdist tests
	$(PY) -m ruff check --fix tfdist tests

bench: $(STAMP)
	$(PY) -m tfdist bench

# Runs every notebook top to bottom and stores it with its outputs (plots included);
# tests/test_notebooks.py checks that the stored outputs are those a run gives.
notebooks: $(STAMP)
	$(PY) -m tests.notebook_outputs

# The documentation site (docs/, mkdocs.yml) into site/; `$(PY) -m mkdocs serve` to browse it.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) build site *.egg-info
