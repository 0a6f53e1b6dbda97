"""Build the C map, cowstate._cmap, its test-only probe, cowstate_spec._cmap_probe,
cowstate._keygroups, cowstate._void and the C codec, cowstate._codec (everything
else is in pyproject.toml).

The extension is optional: without a compiler the install still succeeds and
``cowstate.CopyOnWriteStateMap`` is the pure-Python map (``cowstate.IMPLEMENTATION``
says which one you got). The probe reads the map's structs through the shared
header ``impl/cowstate/_cmap.h`` (structure export, the checker in C, corruption
hooks); the installed map itself has none of them. ``COWSTATE_CFLAGS`` adds compiler flags, e.g. the
sanitizer build of ``make sanitize``.
"""

import os
import shlex
import sysconfig

from setuptools import Extension, setup

extra = shlex.split(os.environ.get("COWSTATE_CFLAGS", ""))
flags = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
         "-Wno-missing-field-initializers", "-Wno-cast-function-type", *extra]
sanitizer = [f for f in extra if f.startswith("-fsanitize")]
optional_c = os.environ.get("COWSTATE_REQUIRE_C") != "1"  # 1: a failed build fails


def _zlib_header() -> bool:
    """Whether zlib.h is there: the codec's CRC32 is then zlib's own crc32()."""
    dirs = [sysconfig.get_paths()["include"], "/usr/include", "/usr/local/include",
            *os.environ.get("C_INCLUDE_PATH", "").split(os.pathsep)]
    return any(d and os.path.exists(os.path.join(d, "zlib.h")) for d in dirs)


ZLIB = _zlib_header()

setup(
    ext_modules=[
        Extension(
            "cowstate._cmap",
            sources=["impl/cowstate/_cmap.c"],
            depends=["impl/cowstate/_cmap.h"],
            extra_compile_args=flags,
            extra_link_args=sanitizer,
            optional=optional_c,
        ),
        # The map seen from inside, for the specification only (built with the map,
        # never imported by cowstate).
        Extension(
            "cowstate_spec._cmap_probe",
            sources=["spec/cowstate_spec/_cmap_probe.c"],
            depends=["impl/cowstate/_cmap.h"],
            include_dirs=["impl/cowstate"],
            extra_compile_args=flags,
            extra_link_args=sanitizer,
            optional=optional_c,
        ),
        # Key groups of many keys at once (the restore's key-group check);
        # optional: without it the check runs in Python (cowstate.snapshot.checks).
        Extension(
            "cowstate._keygroups",
            sources=["impl/cowstate/_keygroups.c"],
            extra_compile_args=flags,
            extra_link_args=sanitizer,
            optional=True,
        ),
        # VOID_NAMESPACE as an instance of a type the garbage collector never
        # tracks (issue 28); optional: without it, a Python singleton.
        Extension(
            "cowstate._void",
            sources=["impl/cowstate/_void.c"],
            extra_compile_args=flags,
            extra_link_args=sanitizer,
            optional=True,
        ),
        # The C codec of snapshot entries (the value codec's and the key
        # serializers' bytes, CRC32): the library _codec.c and its module;
        # optional like the map: without it the writer and reader run in Python.
        Extension(
            "cowstate._codec",
            sources=[
                "impl/cowstate/_codecmodule.c",
                "impl/cowstate/_codec.c",
                "impl/cowstate/_writer.c",
            ],
            depends=["impl/cowstate/_codec.h", "impl/cowstate/_writer.h", "impl/cowstate/_cmap.h"],
            define_macros=[("COWSTATE_CODEC_ZLIB", "1")] if ZLIB else [],
            libraries=["z"] if ZLIB else [],
            extra_compile_args=flags,
            extra_link_args=sanitizer,
            optional=optional_c,
        ),
    ],
)
