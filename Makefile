# The two commands of README.md. `make campaign` sets up .venv and runs the default campaign;
# `make test` sets up .venv and runs the test suite. Extra Snakemake flags: make campaign ARGS="..."
.PHONY: setup lock campaign test report device-check release-check
CORES ?= all

setup:
	@bash scripts/setup.sh

# scripts/constraints.txt, the versions setup installs: after a change to pyproject.toml's dependencies
lock:
	@bash scripts/lock.sh

# The sandbox check stops the campaign before any job (not after generation) where scoring could
# not run: bubblewrap missing or broken and no opt-in (`sandbox: process`, DLMPIPE_SANDBOX).
campaign: setup
	.venv/bin/python -m dlmpipe check-sandbox -- $(ARGS)
	.venv/bin/snakemake --cores $(CORES) $(ARGS)

report: setup
	.venv/bin/snakemake --cores $(CORES) --report results/report.html

# One worker per core (pytest-xdist); a test file on one worker, so module fixtures (a toy campaign
# run, tiny checkpoints) are built once, except the files of many independent tests that
# tests/conftest.py's SPREAD_FILES lets spread. TEST_WORKERS=0 runs in this process. The JUnit XML
# it writes is what `benchmarks/cost_by_part.py suite` reads (the suite's cost by test file).
TEST_WORKERS ?= auto
test: setup
	.venv/bin/python -m pytest -ra --durations=25 -n $(TEST_WORKERS) --dist loadgroup --junitxml=.test-results/junit.xml $(ARGS)

# Everything that needs a GPU, as one prepared command (benchmarks/device_check.py): on one GPU
# it finishes in at most 8 minutes and writes its report to OUT (default results/device_check);
# without a GPU it runs the CPU-sized version of each part.
device-check: setup
	.venv/bin/python benchmarks/device_check.py $(if $(OUT),--out $(OUT)) $(ARGS)

# The independent release checks (docs/METHODS.md, "The decode trace"): the releases' own code from
# the checkouts under RELEASES, run by RELEASE_PYTHON (a release venv), against dlmpipe.
# make release-check RELEASE_PYTHON=... RELEASES=... [WHICH=fast_dllm_v2|sdar|dinfer]
release-check: setup
	bash scripts/release_check/run.sh $(RELEASE_PYTHON) $(RELEASES) $(or $(WHICH),all)
