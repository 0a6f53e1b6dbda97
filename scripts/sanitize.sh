#!/usr/bin/env bash
# make sanitize: the C extensions (the C map, cowstate._cmap, its test-only probe,
# cowstate_spec._cmap_probe, and the key-group helper, cowstate._keygroups) built with
# AddressSanitizer and UndefinedBehaviorSanitizer
# (gcc's runtimes, preloaded into the venv's ordinary Python), running the map state
# machine over the C map (capacities 4 and 128), the C-map tests and the map scenarios
# (all but the two long random-isolation ones, which take many minutes under ASan),
# and the restore checks that drive _keygroups.
#
# The sanitized build goes to build/sanitize/ (copies of impl/cowstate and
# spec/cowstate_spec with the instrumented extensions), put first on PYTHONPATH, so
# the normal build is untouched. The probe runs there too: the checker in C judges
# every step of the machines, and the corruption tests make and undo every corruption.
# PYTHONMALLOC=malloc lets ASan see every allocation; leak detection is off because
# CPython itself keeps memory at exit -- leaks are the job of
# tests/test_implementations.py::test_build_snapshot_mutate_release_drop_leaks_nothing.
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
for source in cowstate/_cmap cowstate/_keygroups cowstate_spec/_cmap_probe; do
    gcc -shared -fPIC -std=c11 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all \
        -fsanitize=address,undefined -Wall -Wextra -Wno-unused-parameter \
        -Wno-missing-field-initializers -Wno-cast-function-type -Werror \
        -I"$INCLUDE" -I"$OUT/cowstate" "$OUT/$source.c" -o "$OUT/$source$SUFFIX"
done
export PYTHONPATH="$PWD/$OUT"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONMALLOC=malloc PYTHONHASHSEED=0
$PY -c 'import cowstate, cowstate._cmap as c, cowstate._keygroups as k, cowstate_spec._cmap_probe as p; assert cowstate.IMPLEMENTATION == "c"; print("sanitized:", c.__file__, k.__file__, p.__file__)'
$PY -m pytest -q -p no:cacheprovider -k "not python and not random_modifications" \
    "tests/test_state_machine.py::test_implementation_agrees_with_the_model[c-map]" \
    "tests/test_state_machine.py::test_implementation_agrees_with_the_model[c-map-128]" \
    tests/test_implementations.py tests/test_flink_map_scenarios.py tests/test_copy_costs.py \
    tests/test_seed_examples.py tests/test_bad_input.py tests/test_error_messages.py \
    tests/test_restore_checks.py "$@"
