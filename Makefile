# One Makefile whose targets CI calls too. Every target installs what it needs first,
# so `make test` or `make demo` works as the first command on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
BENCH_STAMP := $(VENV)/.bench-stamp
# The PostgreSQL rows of `make bench` (and the procrastinate peer, when installed) use this.
LOCAL_POSTGRES_DSN := postgresql://postgres@127.0.0.1:5432/test
export FORGEZERO_BENCH_POSTGRES_DSN ?= $(LOCAL_POSTGRES_DSN)
# `make test` runs the PostgreSQL tests against FORGEZERO_TEST_POSTGRES_DSN, or, when it is unset,
# against the local server if one answers at LOCAL_POSTGRES_DSN; otherwise they skip, saying so.
PG_ANSWERS = $(BIN)/python -c 'import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=3).close()'
TEST_POSTGRES_DSN = $(or $(FORGEZERO_TEST_POSTGRES_DSN),$(shell $(PG_ANSWERS) '$(LOCAL_POSTGRES_DSN)' >/dev/null 2>&1 && echo '$(LOCAL_POSTGRES_DSN)'))

.PHONY: install test test-postgres-dsn lint format bench bench-quick demo run soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	rm -f .coverage .coverage.*
	$(eval DSN := $(TEST_POSTGRES_DSN))
	@echo "PostgreSQL tests: $(or $(DSN),skipped: nothing answers at $(LOCAL_POSTGRES_DSN) and FORGEZERO_TEST_POSTGRES_DSN is unset)"
	FORGEZERO_TEST_POSTGRES_DSN='$(DSN)' $(BIN)/coverage run -m pytest $(PYTEST_ARGS)
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report

# The DSN `make test` gives the PostgreSQL tests (empty: they skip).
test-postgres-dsn:
	@echo '$(TEST_POSTGRES_DSN)'

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

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
			tests/serve/test_handover.py -q -rxX -p no:cacheprovider

run: $(STAMP)
	BIN=$(BIN) examples/run.sh

clean:
	rm -rf $(VENV) .coverage .coverage.* .pytest_cache .mypy_cache .ruff_cache
