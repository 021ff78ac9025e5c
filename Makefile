# Two entry points on a fresh machine: `make demo` and `make test`.
# Both build ./.venv (Python >= 3.11, no system MPI needed: MPI comes from the mpich wheel;
# the extra veros brings the ocean model of `ensio example veros` and its tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
STAMP := $(VENV)/.ensio-installed
DEMO_DIR ?= demo
# pytest-xdist workers for the serial suite (CI machines have 2 cores). Tests of one file
# share a worker (module fixtures are built once) and all SLURM files share one (they wait
# on the one-node cluster's timers while the other worker runs CPU-bound files), longest
# files first: tests/xdist_schedule.py, used by `--dist loadfile`.
PYTEST_WORKERS ?= 2
# ensio's own bytecode, written once: an editable install has none, and where
# PYTHONDONTWRITEBYTECODE is set (CI, shared checkouts) every `ensio` process the tests,
# member jobs and demos start would compile ~300 modules again (0.47 -> 0.31 s per heavy
# import here). Stale files are harmless: Python checks each against its source.
COMPILE = $(PY) -m compileall -q src/ensio

.PHONY: venv demo test test-full test-serial test-mpi lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,veros]'
	@test -x $(MPIEXEC) || (echo "error: $(MPIEXEC) missing: the mpich wheel did not install" >&2; exit 1)
	@# numba compiles the analysis kernels once here, into its cache (src/ensio/analysis/__pycache__),
	@# not inside the first test, member job or timed benchmark that calls them (issue 24)
	$(PY) -m ensio.cli.warm
	$(COMPILE)
	touch $(STAMP)

demo: $(STAMP)
	$(COMPILE)
	rm -rf $(DEMO_DIR)/lorenz96
	$(VENV)/bin/ensio cycle examples/lorenz96/cycle.yaml --workdir $(DEMO_DIR)/lorenz96 --cycles 4
	$(VENV)/bin/ensio report $(DEMO_DIR)/lorenz96
	$(VENV)/bin/ensio model l96 rmse --workdir $(DEMO_DIR)/lorenz96
	rm -rf $(DEMO_DIR)/lorenz96-online
	$(VENV)/bin/ensio cycle examples/lorenz96/cycle.yaml --workdir $(DEMO_DIR)/lorenz96-online --cycles 4 --mode online
	$(VENV)/bin/ensio model l96 compare --workdir $(DEMO_DIR)/lorenz96-online --other $(DEMO_DIR)/lorenz96

test: $(STAMP) test-serial test-mpi

test-serial: $(STAMP)
	$(COMPILE)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests --ignore=tests/mpi

# The same suites with the full kill matrices and random-draw counts (tests/matrix.py):
# by default each fault label and each rank count is covered with fewer draws.
test-full: export ENSIO_TEST_FULL = 1
test-full: test

test-mpi: $(STAMP)
	$(COMPILE)
	$(MPIEXEC) -n 2 $(PY) tests/mpi/run.py -q
	$(MPIEXEC) -n 4 $(PY) tests/mpi/run.py -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(DEMO_DIR) build src/*.egg-info
