# Two entry points for a fresh machine: `make demo` and `make test`.
# Each target installs what it needs: a venv with both distributions, and the npm test tools.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
NPM_DIR := tests/conformance
BENCH_NPM_DIR := bench

.PHONY: test demo lint venv npm clean bench-server

$(BIN)/.installed: pyproject.toml server/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]" -e ./server
	touch $@

$(NPM_DIR)/node_modules/.installed: $(NPM_DIR)/package.json $(NPM_DIR)/package-lock.json
	cd $(NPM_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(BENCH_NPM_DIR)/node_modules/.installed: $(BENCH_NPM_DIR)/package.json $(BENCH_NPM_DIR)/package-lock.json
	cd $(BENCH_NPM_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

venv: $(BIN)/.installed

# The conformance suite, and the Node reference server (compatibility tests and benchmarks).
npm: $(NPM_DIR)/node_modules/.installed $(BENCH_NPM_DIR)/node_modules/.installed

lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: venv npm lint
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/pytest

demo: venv
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m durastream_spark.demo

# Our server against the Node reference server, alternating, full sizes (docs/benchmarks.md; about
# 15 minutes). The script would also run `npm ci` in bench/ itself if the reference server were missing.
bench-server: venv $(BENCH_NPM_DIR)/node_modules/.installed
	$(BIN)/python bench/server_bench.py --quiet-wait 120

clean:
	rm -rf $(VENV) $(NPM_DIR)/node_modules
