# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test manage bench chaos install lock lint clean

# Every dependency pinned with its hashes (make lock writes both files from
# pyproject.toml): the dev lock for make run and make test, the runtime one
# for the image (Dockerfile).
LOCK     := requirements.lock
DEV_LOCK := requirements-dev.lock

$(STAMP): $(DEV_LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --no-deps -r $(DEV_LOCK)
	touch $(STAMP)

install: $(STAMP)

# Resolve pyproject.toml again (PyPI) into the two lock files; uv resolves,
# from a throwaway virtualenv, for every platform (the image's too).
UV_COMPILE = .venv-lock/bin/uv pip compile pyproject.toml --universal --python-version 3.11 \
	--generate-hashes --quiet
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install --quiet uv
	$(UV_COMPILE) --extra dev -o $(DEV_LOCK)
	$(UV_COMPILE) -c $(DEV_LOCK) -o $(LOCK)
	rm -rf .venv-lock

run: install
	scripts/run.sh

# The browser tests need Debian's Chromium, the alert rules' tests promtool
# (Debian's prometheus): each found, installed, or one line naming it.
test: install
	scripts/ensure-chromium.sh
	scripts/ensure-promtool.sh
	scripts/with-services.sh $(BIN)/pytest $(PYTEST_ARGS)

# Any manage.py command with the environment of `make run` (scripts/env.sh),
# e.g. from a second shell while it runs: make manage CMD="audit_sagas".
manage: install
	scripts/manage.sh $(CMD)

# Not timed tests: the benchmark, each figure beside a baseline measured in
# the same run (bench/README.md). BENCH_ARGS=--full for the long variants.
bench: install
	scripts/with-services.sh $(BIN)/python bench/run.py $(BENCH_ARGS)

# The long reliability runs: the chaos stack for minutes, and the stateful
# property test with STATEFUL_EXAMPLES examples on fresh random seeds.
STATEFUL_EXAMPLES ?= 1000
chaos: install
	scripts/with-services.sh $(BIN)/pytest -m chaos -p no:logging tests/test_chaos.py tests/test_chaos_stripe.py tests/test_chaos_cancellation.py $(PYTEST_ARGS)
	scripts/with-services.sh env STATEFUL_EXAMPLES=$(STATEFUL_EXAMPLES) STATEFUL_DERANDOMIZE=0 \
		$(BIN)/pytest -p no:logging tests/test_stateful.py $(PYTEST_ARGS)

# ruff's rules and format, and mypy with the Django and DRF stubs ([tool.mypy]).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Everything make run and make test leave, the embedded PostgreSQL's data
# (var/postgres) with the rest of var/; not while that server runs (make run
# stops it at Ctrl-C). The check needs no virtualenv (devtools/embedded_pg.py
# is standard library only).
clean:
	@if pid=$$(BOXOFFICE_VAR_DIR=$(CURDIR)/var $(PYTHON) -m devtools.embedded_pg running 2>/dev/null); then \
	  echo "make clean: the embedded PostgreSQL of var/postgres is running (pid $$pid): stop make run (Ctrl-C) first, or kill -INT $$pid" >&2; \
	  exit 2; \
	fi
	rm -rf $(VENV) var .pytest_cache
