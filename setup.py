"""Build the C map, cowstate._cmap, cowstate._keygroups and the C codec,
cowstate._codec (everything else is in pyproject.toml).

The extension is optional: without a compiler the install still succeeds and
``cowstate.CopyOnWriteStateMap`` is the pure-Python map (``cowstate.IMPLEMENTATION``
says which one you got). ``COWSTATE_CFLAGS`` adds compiler flags, e.g. the
sanitizer build of ``make sanitize``.
"""

import os
import shlex
import sysconfig

from setuptools import Extension, setup

extra = shlex.split(os.environ.get("COWSTATE_CFLAGS", ""))
WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
            "-Wno-cast-function-type"]


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
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type",
                                *extra],
            extra_link_args=[f for f in extra if f.startswith("-fsanitize")],
            optional=os.environ.get("COWSTATE_REQUIRE_C") != "1",
        ),
        # Key groups of many keys at once (the restore's key-group check);
        # optional: without it the check runs in Python (cowstate.snapshot.checks).
        Extension(
            "cowstate._keygroups",
            sources=["impl/cowstate/_keygroups.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type",
                                *extra],
            extra_link_args=[f for f in extra if f.startswith("-fsanitize")],
            optional=True,
        ),
        # The C codec of snapshot entries (the value codec's and the key
        # serializers' bytes, CRC32): the library _codec.c and its module;
        # optional like the map: without it the writer and reader run in Python.
        Extension(
            "cowstate._codec",
            sources=["impl/cowstate/_codecmodule.c", "impl/cowstate/_codec.c"],
            depends=["impl/cowstate/_codec.h"],
            define_macros=[("COWSTATE_CODEC_ZLIB", "1")] if ZLIB else [],
            libraries=["z"] if ZLIB else [],
            extra_compile_args=["-O2", "-std=c11", *WARNINGS, *extra],
            extra_link_args=[f for f in extra if f.startswith("-fsanitize")],
            optional=os.environ.get("COWSTATE_REQUIRE_C") != "1",
        ),
    ],
)
