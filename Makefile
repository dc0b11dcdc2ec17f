# hangd: two commands for a newcomer.
#   make run   - create ./.venv, install hangd, start `hangd serve` (SQLite by default)
#   make test  - create ./.venv with the test extras, install what the tests need, run them all
#   make test-fast - the same venv, only the tests that need no torchrun, PostgreSQL or Prometheus
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast lint bench deps clean install uninstall mutate mutate-sample matrix matrix-score

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/hangd serve $(ARGS)

# Debian packages the tests use: promtool/prometheus, PostgreSQL, systemd-analyze, unshare/nsenter (the
# two-node test makes each node a PID namespace).
deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v pg_ctlcluster >/dev/null || [ -x /usr/lib/postgresql/*/bin/initdb ] 2>/dev/null || missing="$$missing postgresql"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v ps >/dev/null || missing="$$missing procps"; \
	command -v nsenter >/dev/null && command -v unshare >/dev/null || missing="$$missing util-linux"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Bytecode cached (__pycache__, ignored by git) even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE): the tests start hangd a hundred times and more, and each start would
# compile hangd again (about 0.25 s of CPU); pytest would rewrite every test module's asserts again.
PYCACHE := PYTHONDONTWRITEBYTECODE=
test: deps $(VENV)/.test-installed
	$(PYCACHE) $(BIN)/python -m pytest -q --durations=25 $(PYTEST_ARGS)

# While changing code: no torchrun jobs, no PostgreSQL, no Prometheus, nothing marked slow (markers in
# pyproject.toml), and a quarter of the fuzz examples (tests/fuzz.py). Needs no Debian packages, so no
# `deps`. `make test` before a merge still runs all of it. On two pytest-xdist workers (FAST_WORKERS=0:
# in one process); --dist loadgroup keeps the tests that share a replay on one (tests/conftest.py).
FAST := not torchrun and not postgres and not prometheus and not slow
FAST_WORKERS ?= 2
test-fast: $(VENV)/.test-installed
	$(PYCACHE) HANGD_FUZZ_SCALE=$${HANGD_FUZZ_SCALE:-0.25} $(BIN)/python -m pytest -q --durations=25 \
		-n $(FAST_WORKERS) --dist loadgroup -m "$(FAST)" $(PYTEST_ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check hangd migrations tests benchmarks scripts
	$(BIN)/mypy

# Mutation testing of the files in [tool.mutmut] only_mutate (pyproject.toml); see docs/testing.md.
# Not part of `make test` or CI: a full run takes hours on two cores (docs/testing.md: sampling).
# MUTMUT_ARGS="--max-children 2" or mutant names to judge only those.
$(VENV)/.mutate-installed: pyproject.toml | $(VENV)/.test-installed
	$(BIN)/pip install -q -e '.[test,mutate]'
	touch $@

mutate: $(VENV)/.mutate-installed
	rm -rf mutants
	HANGD_FUZZ_SCALE=0.1 $(BIN)/mutmut run $(MUTMUT_ARGS)
	$(BIN)/mutmut results --all true > mutmut-results.txt || true
	$(BIN)/python scripts/mutation_score.py mutmut-results.txt

# A seeded sample of the analysis' mutants judged in one run (docs/testing.md): SAMPLE=150 SEED=2026.
mutate-sample: $(VENV)/.mutate-installed
	SAMPLE=$(or $(SAMPLE),150) SEED=$(or $(SEED),2026) BIN=$(BIN) bash scripts/mutate-sample.sh

bench: $(VENV)/.test-installed
	$(BIN)/python -m benchmarks.replay
	$(BIN)/python -m benchmarks.overhead
	$(BIN)/python -m benchmarks.api
	$(BIN)/python -m benchmarks.procread
	$(BIN)/python -m benchmarks.busy_stacks

# The job matrix (scripts/matrix.py): record every cell again into tests/data/traces/matrix-cpu (about 45 min
# on two cores; MATRIX_ARGS="--only NAME,..." for some), and score the recorded cells, tune and check sets apart.
matrix: $(VENV)/.test-installed
	PYTHONPATH=$(CURDIR) $(BIN)/python scripts/matrix.py $(MATRIX_ARGS)

matrix-score: $(VENV)/.test-installed
	PYTHONPATH=$(CURDIR) $(BIN)/python scripts/matrix.py --score

# Install as a systemd service (run as root): a venv in $(PREFIX), the unit, an env file example.
# EXTRAS=postgres also installs the PostgreSQL driver, for a fleet's shared database:
#   make install EXTRAS=postgres
PREFIX ?= /opt/hangd
EXTRAS ?=
install:
	$(PYTHON) -m venv $(PREFIX)/venv
	$(PREFIX)/venv/bin/pip install -q --upgrade pip
	$(PREFIX)/venv/bin/pip install -q '.$(if $(EXTRAS),[$(EXTRAS)])'
	install -d $(PREFIX)/share/doc /etc/hangd
	install -m 0644 docs/operator-guide.md $(PREFIX)/share/doc/operator-guide.md
	install -m 0644 deploy/systemd/hangd.service /etc/systemd/system/hangd.service
	[ -e /etc/hangd/hangd.env ] || install -m 0600 deploy/systemd/hangd.env /etc/hangd/hangd.env
	if [ -d /run/systemd/system ]; then systemctl daemon-reload && systemctl enable --now hangd.service; fi
	@echo "hangd installed: curl -s 127.0.0.1:9877/incidents"

uninstall:
	if [ -d /run/systemd/system ]; then systemctl disable --now hangd.service || true; fi
	rm -f /etc/systemd/system/hangd.service
	if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	rm -rf $(PREFIX)
	@echo "kept /etc/hangd and /var/lib/hangd (config and history); remove them by hand if you want"

clean:
	rm -rf $(VENV) build *.egg-info
