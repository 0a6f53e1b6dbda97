# cowstate: every target sets itself up (creates .venv, installs the project).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CMAP   := $(VENV)/.cmap-built

## Python writes the bytecode it compiles (__pycache__/, ignored by git) whatever the
## environment says: with PYTHONDONTWRITEBYTECODE set (as where make test is gated),
## each of make test's processes compiled every module it imported again, and each
## pytest process rewrote the asserts of every test file again -- about 15 CPU s per
## pytest process (make sanitize starts three) and 1 per CrossHair job (32).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: test demo cluster-demo bench lint typecheck crosshair pytest strength deep verify mutate sanitize fuzz clean flink-adapter hypothesis-tables

## The install builds the C map (cowstate._cmap) and its test-only probe
## (cowstate_spec._cmap_probe) in place; $(CMAP) rebuilds them when a source
## changes, without reinstalling everything.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools>=77'
	$(PY) -m pip install --quiet --no-compile -e '.[dev,spark,rocksdb,bench]'
	touch $(STAMP)

$(CMAP): $(STAMP) impl/cowstate/_cmap.c impl/cowstate/_cmap.h spec/cowstate_spec/_cmap_probe.c \
		impl/cowstate/_keygroups.c impl/cowstate/_void.c impl/cowstate/_codec.c \
		impl/cowstate/_codec.h impl/cowstate/_codecmodule.c impl/cowstate/_writer.c \
		impl/cowstate/_writer.h setup.py
	$(PY) setup.py --quiet build_ext --inplace
	touch $(CMAP)

## make test: ruff, mypy --strict, bounded CrossHair, the whole pytest suite (the ci
## Hypothesis profile, three workers) and the C code under AddressSanitizer/UBSan (two
## processes), all side by side: the suite waits on JVMs, clusters and timeouts for a
## third of its time, which the others fill. Each target's output is printed when it
## is done (the suite's last, after about 13 minutes); times in CONTRIBUTING.md.
test:
	$(MAKE) --no-print-directory -j5 --output-sync=target lint typecheck crosshair sanitize pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check impl model spec tests bench scripts
	$(VENV)/bin/ruff format --check impl model spec tests bench scripts

## mypy --strict over the tests too (the same settings: see CONTRIBUTING.md, "Types")
typecheck: $(CMAP)
	$(VENV)/bin/mypy --strict impl model spec tests

## CrossHair over the contracts of cowstate.arithmetic and cowstate.key_groups, and the fast/plain equivalences
## (a few CPU seconds per condition, 10-minute deadline; see cowstate_spec.symbolic)
crosshair: $(STAMP)
	$(PY) -m cowstate_spec.symbolic --profile quick

## PYTHONHASHSEED=0: the ci profile replays the same examples every run, and with
## a fixed seed string keys also land in the same buckets, so a run is
## reproducible bit for bit (tests of other seeds set their own).
## PYTEST_JOBS (default 3: the suite waits on JVMs, clusters and timeouts for a
## third of its time, which a third worker on two cores fills; four cost more than
## they filled) pytest-xdist workers, each taking a group of tests at
## a time, heaviest first (--dist loadgroup, in the order tests/schedule.py
## sorts them: a file's module fixtures, Spark sessions among them, stay in one
## process); PYTEST_JOBS=0 runs the suite in this process.
## TEST_PROFILE (default ci, as CI runs it, within make test's 15 minutes): the
## Hypothesis profile; TEST_PROFILE=dev draws more examples from random seeds
## (about 16 minutes in all).
## The spec-strength suites (STRENGTH_TESTS) run here in their reduced form
## (COWSTATE_STRENGTH=reduced, the default): see make strength.
## --max-worker-restart=0: a worker that crashes fails the run at once (its test
## is reported failed, the other workers finish). pytest-xdist 3.8's group
## scheduler replaces a crashed worker by one that hangs: it runs the crashed
## test again, and the dead worker's finished groups come back as empty units
## the end of the run waits on (xdist issues 1323, 1327, 1378). Stop 37's CI
## run crashed one worker and then hung until its 90 minutes were up.
## TEST_TMPDIR (default /dev/shm when it is a directory with 2 GiB free, else
## none: the usual temporary directory): where the tests' temporary files go, a
## fresh directory per run (pytest's --basetemp, removed when the suite passed)
## and TMPDIR. The checkpoint, storage and RocksDB tests write and sync
## thousands of small files, which on a tmpfs cost no journal and no writeback
## (the storage hunts take a fifth less time; the files are as real).
PYTEST_JOBS ?= 3
TEST_PROFILE ?= ci
TEST_TMPDIR ?= $(shell [ -d /dev/shm ] && [ "$$(df -Pk /dev/shm | awk 'NR == 2 {print $$4}')" -ge 2097152 ] 2>/dev/null && echo /dev/shm)
PYTEST_RUN = COWSTATE_PROFILE=$(TEST_PROFILE) PYTHONHASHSEED=0 $(PY) -m pytest \
	-n $(PYTEST_JOBS) --dist loadgroup --no-loadscope-reorder --max-worker-restart=0
pytest: $(CMAP) hypothesis-tables
ifeq ($(TEST_TMPDIR),)
	$(PYTEST_RUN)
else
	base=$$(mktemp -d $(TEST_TMPDIR)/cowstate-tests-XXXXXX) && \
	TMPDIR=$(TEST_TMPDIR) $(PYTEST_RUN) --basetemp=$$base && rm -rf $$base
endif

## The spec-strength suites: every named defect class caught by its machine within
## the ci budget (tests/test_spec_catches_every_class.py), the machines with hostile
## user code over every implementation (tests/test_user_code_errors.py), CrossHair
## refuting every planted arithmetic bug (tests/test_symbolic.py), the planted map,
## C map and backend bugs with the controls of their hunts. Two tiers
## (cowstate_spec.profiles.strength; times in CONTRIBUTING.md):
## - reduced, in make test (so CI runs it): every bug hunted with its full budget,
##   each identity control as far as its bug's hunt went, CrossHair with smaller
##   limits (still twice what each refutation needs, 5/3 for the layout), the
##   hostile machines over every implementation with half the full form's examples;
## - full, make strength: the controls' whole budgets, CrossHair's generous limits,
##   the hostile machines under the dev profile.
STRENGTH_TESTS = tests/test_spec_catches_every_class.py tests/test_user_code_errors.py \
	tests/test_symbolic.py tests/test_spec_catches_bad_cmaps.py tests/test_spec_catches_bad_backends.py \
	tests/test_spec_catches_bad_implementations.py
strength: $(CMAP)
	COWSTATE_STRENGTH=full PYTHONHASHSEED=0 $(PY) -m pytest $(STRENGTH_TESTS)

## make demo: the main job, a differential run of the implementation against the model
demo: $(CMAP)
	$(VENV)/bin/cowstate check --preset smoke

## make cluster-demo: the same on a Spark standalone cluster on loopback (a master and two
## workers), executors on a Python without cowstate (build/executor-python): exactly the
## commands of the README's "On a cluster", on free ports
cluster-demo: $(CMAP)
	$(PY) scripts/cluster_demo.py

## make flink-adapter: Flink's own CopyOnWriteStateMap behind the process protocol
## (docs/protocol.md), for `cowstate check --implementation flink-java`. Downloads the
## apache-flink-libraries wheel pinned by hash in adapters/flink-java/requirements.txt
## (network access to PyPI, ~330 MB), takes its flink-dist jar and compiles the adapter
## with javac (Java 17) into build/flink-adapter/.
FLINK_VERSION := 2.3.0
FLINK_ADAPTER := build/flink-adapter
FLINK_JAR     := $(FLINK_ADAPTER)/lib/flink-dist-$(FLINK_VERSION).jar
FLINK_SOURCE  := adapters/flink-java/src/org/apache/flink/runtime/state/heap/CowstateFlinkAdapter.java
FLINK_CLASS   := $(FLINK_ADAPTER)/classes/org/apache/flink/runtime/state/heap/CowstateFlinkAdapter.class
flink-adapter: $(FLINK_CLASS)

$(FLINK_JAR): adapters/flink-java/requirements.txt $(STAMP)
	mkdir -p build/flink $(FLINK_ADAPTER)/lib
	$(PY) -m pip download --quiet --no-deps --require-hashes -r adapters/flink-java/requirements.txt -d build/flink
	$(PY) -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], 'build/flink')" \
		build/flink/apache_flink_libraries-$(FLINK_VERSION)-py2.py3-none-any.whl pyflink/lib/flink-dist-$(FLINK_VERSION).jar
	cp build/flink/pyflink/lib/flink-dist-$(FLINK_VERSION).jar $@

$(FLINK_CLASS): $(FLINK_SOURCE) $(FLINK_JAR)
	rm -rf $(FLINK_ADAPTER)/classes
	javac --release 17 -Xlint:all,-serial,-processing -d $(FLINK_ADAPTER)/classes -cp $(FLINK_JAR) $(FLINK_SOURCE)

## make bench: the benchmarks, peers side by side (see bench/README.md)
bench: $(CMAP)
	$(PY) bench/bench_state_map.py
	$(PY) bench/bench_differential.py
	$(PY) bench/bench_conformance.py
	$(PY) bench/bench_table_backend.py
	$(PY) bench/bench_checkpoints.py
	$(PY) bench/bench_backend_gc.py
	$(PY) bench/bench_keyed_path.py
	$(PY) bench/bench_serializers.py
	$(PY) bench/bench_snapshot_codec.py
	$(PY) bench/bench_snapshot_codec.py --entries 10000000 --shapes int --repeats 1 \
		--output bench/results/snapshot_codec_10m.json
	$(PY) bench/bench_backend_gc.py --entries 10000000 --repeats 3 \
		--output bench/results/backend_gc_10m.json
	$(PY) bench/targets.py --issue 28
	$(PY) bench/bench_heap_incremental.py
	$(PY) bench/bench_heap_incremental.py --entries 10000000 --repeats 3 --owner-rounds 5 \
		--output bench/results/heap_incremental_10m.json
	$(PY) bench/targets.py --issue 29

## make deep: the map/table, backend and storage state machines under the deep
## Hypothesis profile (by hand; hours -- what is timed is in CONTRIBUTING.md)
deep: $(STAMP)
	COWSTATE_PROFILE=deep PYTHONHASHSEED=0 $(PY) -m pytest -q tests/test_state_machine.py \
		tests/test_backend_machine.py tests/test_storage_machine.py

## make verify: the state machines on the hypothesis-crosshair backend (small bounds),
## then CrossHair with generous limits (by hand; see CONTRIBUTING.md for the time)
verify: $(STAMP)
	COWSTATE_PROFILE=crosshair $(PY) -m pytest -q \
		tests/test_state_machine.py tests/test_arithmetic.py
	$(PY) -m cowstate_spec.symbolic --profile deep

## make mutate: mutmut 3 over the core of impl/cowstate (the map) with the fast
## spec suite as killer; SCOPE=tables mutates the table layer, SCOPE=checkpoint the
## checkpoint layer and the RocksDB backend (hours each on 2 shared cores; ONLY='glob'
## restricts a run to mutants by name, RESUME=1 continues a stopped one); hard per-test
## timeouts end a hanging mutant in seconds; writes build/mutation/report.md over every
## staged scope (see scripts/mutation.py, CONTRIBUTING.md)
mutate: $(STAMP)
	nice -n 10 $(PY) scripts/mutation.py --scope $(or $(SCOPE),core) \
		$(foreach g,$(ONLY),--only '$(g)') $(if $(RESUME),--resume) \
		--max-children $(or $(MUTATE_JOBS),2)

## make sanitize: the C map and the C codec under AddressSanitizer + UBSan (gcc runtimes),
## running the map machines over the C map, the C-map tests and the codec's tests
## (see scripts/sanitize.sh)
sanitize: $(CMAP) hypothesis-tables
	bash scripts/sanitize.sh

## Hypothesis's Unicode tables (.hypothesis/unicode_data), written once before the
## processes that draw text start side by side: each computed them when missing, 6 CPU
## s each in the plain Python, 19 under ASan (see cowstate_spec.profiles)
hypothesis-tables: $(STAMP)
	$(PY) -c 'from cowstate_spec.profiles import warm_unicode_tables; warm_unicode_tables()'

## make fuzz: corrupt snapshot files and checkpoint directories (100,000 + 10,000 cases),
## restore them through every entry point, print the outcome of each class; exit 1 on any
## wrong, partial, escaped or outside-the-root case (see cowstate_spec.fuzz; by hand)
fuzz: $(CMAP)
	PYTHONHASHSEED=0 $(PY) -m cowstate_spec.fuzz --jobs $(or $(FUZZ_JOBS),2)

clean:
	rm -rf $(VENV) .hypothesis .mypy_cache .ruff_cache .pytest_cache build
