#!/usr/bin/env bash
# make sanitize: the C extensions (the C map, cowstate._cmap, its test-only probe,
# cowstate_spec._cmap_probe, the key-group helper, cowstate._keygroups,
# VOID_NAMESPACE's type, cowstate._void, and the C codec, cowstate._codec) built with
# AddressSanitizer and UndefinedBehaviorSanitizer
# (gcc's runtimes, preloaded into the venv's ordinary Python), running the map state
# machine over the C map (capacities 4 and 128), the C-map tests and the map scenarios
# (all but the two long random-isolation ones, which take many minutes under ASan),
# the restore checks that drive _keygroups and the C reader, VOID_NAMESPACE's tests,
# and the C codec's tests: its differential tests, the encoder without the GIL while
# another thread touches the same objects, and the snapshot writer and reader through it
# -- among them the snapshot writer in C (_writer.c, in the codec's module) walking
# maps of several chunks and rehashing ones, and writing while the owner changes the
# table and, breaking the contract, mutates list states of the snapshot in place.
#
# The sanitized build goes to build/sanitize/ (copies of impl/cowstate and
# spec/cowstate_spec with the instrumented extensions), put first on PYTHONPATH, so
# the normal build is untouched. The probe runs there too: the checker in C judges
# every step of the machines, and the corruption tests make and undo every corruption.
# PYTHONMALLOC=malloc lets ASan see every allocation.
#
# LeakSanitizer is on, for the extensions' own allocations: they are compiled with
# PyMem_Malloc/Calloc/Realloc/Free mapped to malloc/calloc/realloc/free, stacks keep
# the allocator and its caller (malloc_context_size=2), and scripts/lsan.supp
# suppresses the blocks whose caller is the interpreter's (or pydantic-core's) code
# (the file says why). An ASan report's allocation and free stacks are two frames
# deep too: for whole stacks, rerun what failed with
#     ASAN_OPTIONS=detect_leaks=0:malloc_context_size=30:... (as exported below)
# A leaked *reference* to a Python object is not a
# leak LeakSanitizer can see (a GC-tracked object stays linked in the collector's
# lists); the reference counts and lifetimes of the tests below catch those
# (tests/test_implementations.py, the machines' states_nothing_holds_are_collected).
# Before the tests, a self-check: a copy whose entry_free() frees the objects but not
# the entry (cowstate_spec.bad_cmaps.LEAK_PROBE) must be reported, the real build not.
#
# SANITIZE_CFLAGS adds compiler flags to the sanitized build, e.g.
#     SANITIZE_CFLAGS=-DCOWSTATE_BUG=6 make sanitize
# plants the leaked reference of c-put-leaks-replaced-state (the tests must fail).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=build/sanitize
rm -rf "$OUT" && mkdir -p "$OUT"
cp -r impl/cowstate "$OUT/cowstate"
cp -r spec/cowstate_spec "$OUT/cowstate_spec"
rm -f "$OUT"/cowstate/*.so "$OUT"/cowstate_spec/*.so
SUFFIX=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
INCLUDE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
# the C map's own blocks straight from malloc, so that no interpreter frame names them
DIRECT_ALLOC="-DPyMem_Malloc=malloc -DPyMem_Calloc=calloc -DPyMem_Realloc=realloc -DPyMem_Free=free"
build() {  # build SOURCE TARGET [FLAGS...]
    local source=$1 target=$2
    shift 2
    # shellcheck disable=SC2086  # DIRECT_ALLOC and SANITIZE_CFLAGS are lists of flags
    gcc -shared -fPIC -std=c11 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all \
        -fsanitize=address,undefined -Wall -Wextra -Wno-unused-parameter \
        -Wno-missing-field-initializers -Wno-cast-function-type -Werror \
        $DIRECT_ALLOC ${SANITIZE_CFLAGS:-} "$@" -I"$INCLUDE" -I"$OUT/cowstate" "$source" -o "$target"
}
# The builds run side by side (the two cores); each is waited for below.
BUILDS=()
for source in cowstate/_cmap cowstate/_keygroups cowstate/_void cowstate_spec/_cmap_probe; do
    build "$OUT/$source.c" "$OUT/$source$SUFFIX" &
    BUILDS+=($!)
done
# the codec: the library and its module, CRC32 from zlib as setup.py builds it
# shellcheck disable=SC2086  # DIRECT_ALLOC and SANITIZE_CFLAGS are lists of flags
gcc -shared -fPIC -std=c11 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all \
    -fsanitize=address,undefined -Wall -Wextra -Wno-unused-parameter \
    -Wno-missing-field-initializers -Wno-cast-function-type -Werror -DCOWSTATE_CODEC_ZLIB=1 \
    $DIRECT_ALLOC ${SANITIZE_CFLAGS:-} -I"$INCLUDE" "$OUT/cowstate/_codecmodule.c" \
    "$OUT/cowstate/_codec.c" "$OUT/cowstate/_writer.c" -lz -o "$OUT/cowstate/_codec$SUFFIX" &
BUILDS+=($!)
# The leak self-check's copy: cowstate._cmap_leakprobe, entry_free() keeping the entry.
$PY - "$OUT/cowstate/_cmap_leakprobe.c" <<'PYTHON'
import sys
from cowstate_spec.bad_cmaps import LEAK_PROBE, SOURCE
text = SOURCE.read_text()
assert text.count(LEAK_PROBE.old) == 1, LEAK_PROBE
open(sys.argv[1], "w").write(text.replace(LEAK_PROBE.old, LEAK_PROBE.new))
PYTHON
build "$OUT/cowstate/_cmap_leakprobe.c" "$OUT/cowstate/_cmap_leakprobe$SUFFIX" \
    -DCOWSTATE_MODULE=_cmap_leakprobe &
BUILDS+=($!)
for pid in "${BUILDS[@]}"; do
    wait "$pid" || { echo "sanitize: a sanitized build failed (above)" >&2; exit 1; }
done

export PYTHONPATH="$PWD/$OUT"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=1:malloc_context_size=2:verify_asan_link_order=0:abort_on_error=1
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONMALLOC=malloc PYTHONHASHSEED=0
# The leak tests run a tenth of their cycles here (tests/leak_support.py, cycles):
# the sanitizers report in the first cycle that goes wrong; the plain suite runs
# every cycle and compares the counts and the memory.
export COWSTATE_SANITIZED=1
# Hypothesis (ASan makes each example cost 2-3x): the codec's and the writer's tests
# under the sanitize profile (a quarter of ci's examples), the maps' under
# sanitize-maps (an eighth): the two processes together reach every line and branch
# of the C code there that they reach with 60 examples (gcov; see
# cowstate_spec.profiles). A COWSTATE_PROFILE given replaces both.
CODEC_PROFILE=${COWSTATE_PROFILE:-sanitize}
MAPS_PROFILE=${COWSTATE_PROFILE:-sanitize-maps}
$PY -c 'import cowstate, cowstate._cmap as c, cowstate._keygroups as k, cowstate._void as v, cowstate._codec as d, cowstate_spec._cmap_probe as p; assert cowstate.IMPLEMENTATION == "c" and type(cowstate.VOID_NAMESPACE) is v.VoidNamespace; print("sanitized:", c.__file__, k.__file__, v.__file__, d.__file__, p.__file__)'

# LeakSanitizer self-check: a map that removes 1,000 mappings, on each build.
LEAKS='import importlib, sys
m = importlib.import_module(sys.argv[1]).CopyOnWriteStateMap(initial_capacity=4)
for i in range(1000):
    m.put(i, "ns", [i])
for i in range(1000):
    m.remove(i, "ns")'
SELF_CHECK=detect_leaks=1:malloc_context_size=2:verify_asan_link_order=0
if ! report=$(ASAN_OPTIONS=$SELF_CHECK $PY -c "$LEAKS" cowstate._cmap 2>&1); then
    echo "$report" >&2
    echo "sanitize: LeakSanitizer reports a leak of the real C map (above)" >&2
    exit 1
fi
if report=$(ASAN_OPTIONS=$SELF_CHECK $PY -c "$LEAKS" cowstate._cmap_leakprobe 2>&1) \
    || ! grep -q "in entry_new" <<<"$report"; then
    echo "$report" >&2
    echo "sanitize: LeakSanitizer missed the planted leak of _cmap_leakprobe (entries never freed)" >&2
    exit 1
fi
echo "LeakSanitizer self-check: the planted entry leak is reported ($(grep -c 'in entry_new' <<<"$report") stacks), the real C map is clean"

# Two processes on the two cores: the maps' suites here, the codec's and the
# writer's beside them (their output follows when both are done).
# (no program but the sanitized Python runs from here on: LD_PRELOAD would give
# it the sanitizer, whose leak check fails it -- so no mktemp, no cat)
CODEC_LOG="$OUT/codec-tests.log"
# Not here: the tests of the codecs and C maps cowstate_spec.bad_codecs and bad_cmaps
# build -- planted bugs, and the controls built the same way -- which are compiled
# without the sanitizer (make test runs them): "planted" and "built_the_same_way" in
# the codec's names, "leak_test_catches" in the maps'.
# One process for both files (each Python under ASan takes seconds to start and
# collect): the codec's tests (their names say "python" for the Python serializers:
# no "python" filter), the writer's and reader's of test_snapshot_io.py, and
# the frozen changes' (test_frozen_changes.py).
COWSTATE_PROFILE=$CODEC_PROFILE $PY -m pytest -q -p no:cacheprovider \
    tests/test_c_codec.py tests/test_snapshot_io.py tests/test_frozen_changes.py \
    -k "(test_c_codec.py and not planted and not built_the_same_way) or (test_snapshot_io.py \
        and (codec or c_reader or c_writer or hands_back or keyboard or long_section) \
        and not planted) or test_frozen_changes.py" "$@" > "$CODEC_LOG" 2>&1 &
CODEC=$!
MAPS_STATUS=0
COWSTATE_PROFILE=$MAPS_PROFILE $PY -m pytest -q -p no:cacheprovider \
    -k "not python and not random_modifications and not leak_test_catches" \
    "tests/test_state_machine.py::test_implementation_agrees_with_the_model[c-map]" \
    "tests/test_state_machine.py::test_implementation_agrees_with_the_model[c-map-128]" \
    tests/test_implementations.py tests/test_flink_map_scenarios.py tests/test_copy_costs.py \
    tests/test_seed_examples.py tests/test_bad_input.py tests/test_error_messages.py \
    tests/test_restore_checks.py tests/test_change_tracking.py \
    "tests/test_checkpoint_rules.py::test_a_heap_delta_holds_what_changed_since_the_confirmed_checkpoint" \
    tests/test_table_contracts.py::test_void_namespace_is_one_named_value_the_collector_never_tracks \
    tests/test_backend.py::test_a_backend_of_int_and_str_states_costs_the_collector_nothing "$@" \
    || MAPS_STATUS=$?
CODEC_STATUS=0
wait "$CODEC" || CODEC_STATUS=$?
while IFS= read -r line; do printf '%s\n' "$line"; done < "$CODEC_LOG"
if [ "$MAPS_STATUS" -ne 0 ] || [ "$CODEC_STATUS" -ne 0 ]; then
    echo "sanitize: the maps' suites exited $MAPS_STATUS, the codec's and the writer's $CODEC_STATUS" >&2
    exit 1
fi
