"""Build the C map, cowstate._cmap, cowstate._keygroups and cowstate._void (everything
else is in pyproject.toml).

The extension is optional: without a compiler the install still succeeds and
``cowstate.CopyOnWriteStateMap`` is the pure-Python map (``cowstate.IMPLEMENTATION``
says which one you got). ``COWSTATE_CFLAGS`` adds compiler flags, e.g. the
sanitizer build of ``make sanitize``.
"""

import os
import shlex

from setuptools import Extension, setup

extra = shlex.split(os.environ.get("COWSTATE_CFLAGS", ""))

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
        # VOID_NAMESPACE as an instance of a type the garbage collector never
        # tracks (issue 28); optional: without it, a Python singleton.
        Extension(
            "cowstate._void",
            sources=["impl/cowstate/_void.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type",
                                *extra],
            extra_link_args=[f for f in extra if f.startswith("-fsanitize")],
            optional=True,
        ),
    ],
)
