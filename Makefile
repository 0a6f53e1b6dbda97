# cowstate: every target sets itself up (creates .venv, installs the project).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo bench lint typecheck pytest deep clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,rocksdb]'
	touch $(STAMP)

## make test: ruff, mypy --strict, then the whole pytest suite (ci profile under CI=true)
test: lint typecheck pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check impl model spec tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict impl model spec

pytest: $(STAMP)
	$(PY) -m pytest

## make demo: the main job, a differential run of the implementation against the model
demo: $(STAMP)
	$(VENV)/bin/cowstate check --preset smoke

## make bench: the benchmarks, peers side by side (see bench/README.md)
bench: $(STAMP)
	$(PY) bench/bench_state_map.py
	$(PY) bench/bench_differential.py

## make deep: the state machines under the deep Hypothesis profile (by hand, minutes)
deep: $(STAMP)
	COWSTATE_PROFILE=deep $(PY) -m pytest tests/test_state_machine.py -q

clean:
	rm -rf $(VENV) .hypothesis .mypy_cache .ruff_cache .pytest_cache
