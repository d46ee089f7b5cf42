# Two entry points for a fresh machine: `make demo` and `make test`.
# Each target installs what it needs: a venv with both distributions, and the npm test tools. `make test`
# also runs `test-compat`: the connector's and the server's tests on the oldest supported dependencies
# (pyspark 4.0, uvicorn 0.30, ...: constraints/minimum.txt) in .venv-compat.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
NPM_DIR := tests/conformance
BENCH_NPM_DIR := bench

.PHONY: test demo lint venv npm clean bench-server

$(BIN)/.installed: pyproject.toml server/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,bench]" -e ./server
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
	$(MAKE) --no-print-directory test-compat

demo: venv
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m durastream_spark.demo

# Our server against the Node reference server, alternating, full sizes (docs/benchmarks.md; about
# 15 minutes). The script would also run `npm ci` in bench/ itself if the reference server were missing.
bench-server: venv $(BENCH_NPM_DIR)/node_modules/.installed
	$(BIN)/python bench/server_bench.py --quiet-wait 120

# Regenerate docs/options.md from the option parsers (tests/docs fails while it is out of date).
.PHONY: docs
docs: venv
	$(BIN)/python -m durastream_spark.docs --output docs/options.md

# The oldest supported dependencies (constraints/minimum.txt: pyspark 4.0, which has no admission control
# for Python sources; the other minimums of pyproject.toml and server/pyproject.toml) in a second venv,
# running the connector's tests (the protocol client, the Spark source and sink end to end, the tests
# against the Node reference server) and the server's. Tests that need Spark >= 4.2 skip there, naming the missing API.
COMPAT_VENV ?= .venv-compat
COMPAT_BIN := $(COMPAT_VENV)/bin

$(COMPAT_BIN)/.installed: pyproject.toml server/pyproject.toml constraints/minimum.txt
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_BIN)/pip install --quiet --upgrade pip
	$(COMPAT_BIN)/pip install --quiet -c constraints/minimum.txt -e ".[test]" -e ./server
	touch $@

.PHONY: test-compat
test-compat: $(COMPAT_BIN)/.installed npm
	$(COMPAT_BIN)/python -c "import pyspark, pyarrow, requests; print('test-compat: pyspark', \
	pyspark.__version__, 'pyarrow', pyarrow.__version__, 'requests', requests.__version__)"
	PYSPARK_PYTHON=$(abspath $(COMPAT_BIN)/python) $(COMPAT_BIN)/pytest -p no:cacheprovider \
	tests/connector tests/spark tests/compat tests/server

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(NPM_DIR)/node_modules
