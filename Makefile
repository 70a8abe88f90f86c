# sentemb: `make train` runs the main job, `make test` the test suite; both install and fetch what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install train test test-slow lint format data data-if-missing bench gpu-bundle mteb clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first and pinned: an unpinned torch would pull GBs of CUDA wheels
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

train: data-if-missing
	$(PY) -m sentemb.train $(ARGS)

# one pytest worker per core (at most 4), the cores shared out between them (tests/conftest.py); TEST_WORKERS=0: one process
TEST_WORKERS ?= auto
test: data-if-missing
	$(PY) -m pytest -m "not slow" -q -n $(TEST_WORKERS) --maxprocesses=4 $(ARGS)

test-slow: data-if-missing
	$(PY) -m pytest -m slow -q $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

data: install
	$(PY) -m sentemb.download data

# what train and test read, downloaded into ./data only when no data root holds it (docs/data.md); offline: fails fast
data-if-missing: install
	$(PY) -m sentemb.download --if-missing data

# every benchmark (quick modes) → BENCHMARKS.md; ARGS=--full for the scripts' long modes
bench: install
	$(PY) benchmarks/report.py $(ARGS)

# what a bare GPU machine without network lacks (wheels, MiniLM, the wiki sample, STS-B) in the git-ignored .gpu_bundle/
# (< 60 MiB with the working tree); there: bash benchmarks/gpu/run.sh (docs/speed.md#on-a-gpu)
gpu-bundle: install data-if-missing
	$(PY) benchmarks/gpu/bundle.py $(ARGS)

# MTEB's English STS tasks on an exported folder (needs `pip install mteb` and the Hugging Face Hub)
mteb: install
	$(PY) -m sentemb.mteb_sts $(MODEL)

# says what it would remove (outputs/ holds every run's checkpoints and records) and removes it only with FORCE=1
CLEANED := outputs multirun wandb lightning_logs .pytest_cache
clean:
	@found="$$(for d in $(CLEANED); do [ -e "$$d" ] && echo "$$d"; done)"; \
	if [ -z "$$found" ]; then echo "make clean: nothing to remove ($(CLEANED) are absent)"; \
	elif [ "$(FORCE)" != 1 ]; then echo "make clean: would remove" $$found "(outputs/ and multirun/ hold" \
		"every run's checkpoints and records); nothing removed. To remove them: make clean FORCE=1" >&2; exit 1; \
	else echo "make clean: removing" $$found; rm -rf $$found; fi
