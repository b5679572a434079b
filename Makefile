# One Makefile whose targets CI calls too. Every target installs what it needs first,
# so `make test` or `make demo` works as the first command on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
# The PostgreSQL rows of `make bench` (and the procrastinate peer, when installed) use this.
LOCAL_POSTGRES_DSN := postgresql://postgres@127.0.0.1:5432/test
export FORGEZERO_BENCH_POSTGRES_DSN ?= $(LOCAL_POSTGRES_DSN)
# `make test` runs the PostgreSQL tests against FORGEZERO_TEST_POSTGRES_DSN, or, when it is unset,
# against the local server if one answers at LOCAL_POSTGRES_DSN; otherwise they skip, saying so.
PG_ANSWERS = $(BIN)/python -c 'import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=3).close()'
TEST_POSTGRES_DSN = $(or $(FORGEZERO_TEST_POSTGRES_DSN),$(shell $(PG_ANSWERS) '$(LOCAL_POSTGRES_DSN)' >/dev/null 2>&1 && echo '$(LOCAL_POSTGRES_DSN)'))

.PHONY: install test coverage test-pythons test-oldest test-postgres-dsn lint format docs docs-check \
	bench bench-quick \
	demo run soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The suite runs in TEST_WORKERS pytest-xdist processes whatever the core count: most real-server
# tests wait on subprocesses, sockets and graces, not on a core (tests/conftest.py starts the
# longest first, and the tests that send a user's load in two lanes of their own: loadgroup).
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 8
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadgroup)

# The suite starts a few hundred Python processes, each importing the library. Where the
# environment turns bytecode writing off (PYTHONDONTWRITEBYTECODE, set in some CI images), each
# of them compiles the library's sources again: 0.13 s of CPU apiece, 80 s of a run's.
unexport PYTHONDONTWRITEBYTECODE

# COVERAGE=1 measures branch coverage, subprocesses included (about a third more CPU), but for
# the `load` tests, which run untraced (tests/conftest.py). CI runs make test this way.
RUN_PYTEST = $(if $(COVERAGE),$(BIN)/coverage run -m pytest,$(BIN)/python -m pytest)

test: $(STAMP)
	$(if $(COVERAGE),rm -f .coverage .coverage.*)
	$(eval DSN := $(TEST_POSTGRES_DSN))
	@echo "PostgreSQL tests: $(or $(DSN),skipped: nothing answers at $(LOCAL_POSTGRES_DSN) and FORGEZERO_TEST_POSTGRES_DSN is unset)"
	FORGEZERO_TEST_POSTGRES_DSN='$(DSN)' $(RUN_PYTEST) $(XDIST) $(PYTEST_ARGS)
	$(if $(COVERAGE),$(BIN)/coverage combine --quiet && $(BIN)/coverage report)

coverage:
	$(MAKE) test COVERAGE=1

# The suite on every CPython 3.11+ this machine has, one after the other, each in its own
# .venv-3.x: the whole suite on the oldest and the newest, the real-server, serve and CLI tests
# on the others (tests/pythons.py). TEST_PYTHONS_ARGS: --require fails when a version the
# classifiers list is missing, --skip 3.11 leaves out one already run, -- passes on to pytest.
test-pythons: $(STAMP)
	$(eval DSN := $(TEST_POSTGRES_DSN))
	FORGEZERO_TEST_POSTGRES_DSN='$(DSN)' $(BIN)/python tests/pythons.py $(TEST_PYTHONS_ARGS) \
		-- $(XDIST)

# The real-server tests on the lowest versions pyproject.toml declares (.ci/oldest-constraints.txt),
# in a venv of their own. gunicorn's cases are left out (and tests/reliability/test_signal_stop.py,
# whose plain servers include it): its uvicorn worker needs uvicorn >= 0.36. Two third-party
# warnings are ignored for this run only: old starlette imports `multipart`, and uvicorn 0.30
# imports websockets' deprecated `legacy` module.
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed-stamp
OLDEST_TESTS := tests/serve tests/asgi tests/real_servers tests/reliability/test_zero_loss.py
OLDEST_TOOLS := 'pytest>=8.2' 'pytest-xdist>=3.6' 'anyio>=4.4' 'asgi-lifespan>=2.1' 'pytest-timeout>=2.3' \
	'hypothesis>=6.100' 'uvicorn[standard]' hypercorn fastapi websockets 'granian>=2.0' \
	opentelemetry-sdk
OLDEST_WARNINGS := -W 'ignore:Please use `import python_multipart` instead.:PendingDeprecationWarning' \
	-W 'ignore:websockets.:DeprecationWarning'

$(OLDEST_STAMP): pyproject.toml .ci/oldest-constraints.txt
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -c .ci/oldest-constraints.txt \
		-e '.[postgres,metrics,otel]' $(OLDEST_TOOLS)
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST)/bin/python -m pip freeze | grep -iE '^(uvicorn|starlette|fastapi|hypercorn|httpx|pydantic|websockets)=='
	$(OLDEST)/bin/python -m pytest $(OLDEST_TESTS) -k 'not gunicorn' $(OLDEST_WARNINGS) \
		-p no:cacheprovider $(XDIST) $(PYTEST_ARGS)

# The DSN `make test` gives the PostgreSQL tests (empty: they skip).
test-postgres-dsn:
	@echo '$(TEST_POSTGRES_DSN)'

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml, pyproject's `docs` extra), built into site/. --strict: a
# broken link, anchor or API reference fails the build.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# Mermaid, which draws the site's diagrams, served from the site itself (docs/_ext/hooks.py):
# dist/mermaid.min.js of the npm registry's `mermaid` package, fetched once with npm. Without
# npm the site is built all the same, and Material loads Mermaid from a CDN when a page is read.
MERMAID_VERSION := 11.17.2
MERMAID_JS := $(VENV)/mermaid-$(MERMAID_VERSION)/mermaid.min.js

$(MERMAID_JS):
	@if command -v npm >/dev/null 2>&1; then \
		tmp=$$(mktemp -d) && (cd $$tmp && npm pack --silent mermaid@$(MERMAID_VERSION) >/dev/null) \
		&& tar -xzf $$tmp/mermaid-$(MERMAID_VERSION).tgz -C $$tmp package/dist/mermaid.min.js \
		&& mkdir -p $(@D) && mv $$tmp/package/dist/mermaid.min.js $@; \
		status=$$?; rm -rf $$tmp; exit $$status; \
	else \
		echo "make docs: npm not found, so Mermaid is not served from the site (a reader's"; \
		echo "  browser loads it from a CDN); install Node.js and npm to serve it from the site"; \
	fi

docs: $(DOCS_STAMP) $(MERMAID_JS)
	$(if $(wildcard $(MERMAID_JS)),FORGEZERO_DOCS_MERMAID=$(MERMAID_JS)) NO_MKDOCS_2_WARNING=1 \
		$(BIN)/mkdocs build --strict --site-dir site

# The site built, then every page opened in headless Chromium (tests/docs_site.py): console
# errors, Mermaid that did not render, code or tables wider than their column at 1280 px, broken
# links and images, tabs that do not switch; screenshots in build/docs-check/. Playwright comes
# from PyPI (the `docs-check` extra) and drives Debian's `chromium`, which this target installs
# with apt-get when it is missing and it can (root); otherwise it skips, saying what to install
# (in CI, CI=true, it fails instead).
DOCS_CHECK_STAMP := $(VENV)/.docs-check-stamp

$(DOCS_CHECK_STAMP): $(DOCS_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[docs-check]'
	touch $(DOCS_CHECK_STAMP)

docs-check: $(DOCS_CHECK_STAMP)
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
		&& [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make docs-check: installing Debian's chromium"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q chromium >/dev/null 2>&1 \
			|| { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	fi
	$(MAKE) docs
	$(BIN)/python tests/docs_site.py site --screenshots build/docs-check

format: $(STAMP)
	$(BIN)/ruff check --fix src tests bench examples
	$(BIN)/ruff format src tests bench examples

# The peers of the comparison rows (pyproject's `bench` extra). One that fails to install does
# not stop the run: its rows say "not run" and why, and the next `make bench` tries again.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[bench]' && touch $(BENCH_STAMP) \
		|| echo "make bench: the bench extra did not install; the peers' rows will say why"

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m bench --quick

demo: $(STAMP)
	$(BIN)/forgezero-lifecycle demo

# The long form of the reliability and fuzzing suites (RELIABILITY.md's figures come from it).
soak: $(STAMP)
	rm -f reliability-report.jsonl
	FORGEZERO_SOAK=1 FORGEZERO_RELIABILITY_REPORT=reliability-report.jsonl \
		$(BIN)/python -m pytest tests/reliability tests/security tests/ops/test_schemathesis.py \
			tests/serve/test_handover.py tests/serve/test_foreign_handover.py \
			tests/serve/test_supervisor_machine.py -q -rxX -p no:cacheprovider

run: $(STAMP)
	BIN=$(BIN) examples/run.sh

clean:
	rm -rf $(VENV) .venv-3.* $(OLDEST) site build/docs-check .coverage .coverage.* .pytest_cache \
		.mypy_cache .ruff_cache
