#!/usr/bin/env bash
# make sanitize: the C extensions (the C map, cowstate._cmap, the key-group helper,
# cowstate._keygroups, and the C codec, cowstate._codec) built with AddressSanitizer
# and UndefinedBehaviorSanitizer (gcc's runtimes, preloaded into the venv's ordinary
# Python), running the map state machine over the C map (capacities 4 and 128), the
# C-map tests and the map scenarios (all but the two long random-isolation ones, which
# take many minutes under ASan), the restore checks that drive _keygroups and the C
# reader, and the C codec's tests: its differential tests, the encoder without the GIL
# while another thread touches the same objects, and the snapshot writer and reader
# through it.
#
# The sanitized build goes to build/sanitize/ (a copy of impl/cowstate with the
# instrumented extensions), put first on PYTHONPATH, so the normal build is untouched.
# PYTHONMALLOC=malloc lets ASan see every allocation; leak detection is off because
# CPython itself keeps memory at exit -- leaks are the job of
# tests/test_implementations.py::test_build_snapshot_mutate_release_drop_leaks_nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=build/sanitize
rm -rf "$OUT" && mkdir -p "$OUT"
cp -r impl/cowstate "$OUT/cowstate"
rm -f "$OUT"/cowstate/*.so
SUFFIX=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
INCLUDE=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
for module in _cmap _keygroups; do
    gcc -shared -fPIC -std=c11 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all \
        -fsanitize=address,undefined -Wall -Wextra -Wno-unused-parameter \
        -Wno-missing-field-initializers -Wno-cast-function-type -Werror \
        -I"$INCLUDE" "$OUT/cowstate/$module.c" -o "$OUT/cowstate/$module$SUFFIX"
done
# the codec: the library and its module, CRC32 from zlib as setup.py builds it
gcc -shared -fPIC -std=c11 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all \
    -fsanitize=address,undefined -Wall -Wextra -Wno-unused-parameter \
    -Wno-missing-field-initializers -Wno-cast-function-type -Werror -DCOWSTATE_CODEC_ZLIB=1 \
    -I"$INCLUDE" "$OUT/cowstate/_codecmodule.c" "$OUT/cowstate/_codec.c" -lz \
    -o "$OUT/cowstate/_codec$SUFFIX"
export PYTHONPATH="$PWD/$OUT"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONMALLOC=malloc PYTHONHASHSEED=0
$PY -c 'import cowstate, cowstate._cmap as c, cowstate._keygroups as k, cowstate._codec as d; assert cowstate.IMPLEMENTATION == "c"; print("sanitized:", c.__file__, k.__file__, d.__file__)'
$PY -m pytest -q -p no:cacheprovider -k "not python and not random_modifications" \
    "tests/test_state_machine.py::test_implementation_agrees_with_the_model[c-map]" \
    "tests/test_state_machine.py::test_implementation_agrees_with_the_model[c-map-128]" \
    tests/test_implementations.py tests/test_flink_map_scenarios.py tests/test_copy_costs.py \
    tests/test_seed_examples.py tests/test_bad_input.py tests/test_error_messages.py \
    tests/test_restore_checks.py "$@"
# the codec (its test names say "python" for the Python serializers: no -k filter above)
$PY -m pytest -q -p no:cacheprovider tests/test_c_codec.py "$@"
$PY -m pytest -q -p no:cacheprovider tests/test_snapshot_io.py \
    -k "codec or c_reader or c_writer or hands_back or keyboard or long_section" "$@"
