"""Builds of the C codec beside the real one: with a planted defect the
specification must catch, or with the table-driven CRC32 instead of zlib's.

``impl/cowstate/_codec.c`` plants one defect under ``-DCOWSTATE_CODEC_BUG=n``
and the snapshot writer in C, ``impl/cowstate/_writer.c`` (compiled into the
same module), one under ``-DCOWSTATE_WRITER_BUG=n`` (as ``_cmap.c`` under
``COWSTATE_BUG``, :mod:`cowstate_spec.bad_cmaps`). Each
variant is compiled once per source version into ``build/bad_codecs/`` as its
own module (``-DCOWSTATE_CODEC_MODULE=<name>``: ``_codec_bug<n>``,
``_codec_wbug<n>``, or
``_codec_tablecrc`` for the codec as it is; none defines
``COWSTATE_CODEC_ZLIB``, so all have the table-driven CRC32) and loaded
beside ``cowstate._codec``, so the tests drive it with the same functions
(``ccodec.CODEC`` set to it: the snapshot writer then runs its blocks too).

``build_codec(...)`` needs a C compiler and the Python headers (as ``pip
install -e .`` does); it raises ``RuntimeError`` with the compiler's output
when the build fails.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import cowstate
from cowstate_spec.bad_cmaps import SANITIZER_VARIABLES

__all__ = ["CODEC_BUGS", "WRITER_BUGS", "CodecBug", "build_codec"]

# The C sources beside the cowstate package in use: impl/cowstate in the
# repository, build/sanitize/cowstate (a copy) under make sanitize, where
# parents[2] of this file is build/ and holds no impl/.
SOURCES = Path(cowstate.__file__).resolve().parent
BUILD = Path(__file__).resolve().parents[2] / "build" / "bad_codecs"
_FILES = ("_codecmodule.c", "_codec.c", "_codec.h", "_writer.c", "_writer.h", "_cmap.h")


@dataclass(frozen=True)
class CodecBug:
    """One planted defect: its number under ``macro``, what it breaks, and
    which part of the codec holds it (``part``: "encoder", caught by the value
    codec's differential tests, "reader", caught by the test of the restore
    check it breaks, tests/test_spec_catches_bad_checks.py, or "writer",
    caught by the writer's checks in tests/test_snapshot_io.py)."""

    name: str
    number: int
    breaks: str
    macro: str = "COWSTATE_CODEC_BUG"
    prefix: str = "_codec_bug"
    part: str = "encoder"


#: The defects of the C codec the spec must each catch (numbers as in _codec.c).
CODEC_BUGS = [
    CodecBug(
        "codec-non-ascii-length-off-by-one",
        1,
        "the value codec: a length prefix off by one for non-ASCII strings",
    ),
    CodecBug(
        "codec-e1-checks-the-first-entry-only",
        2,
        "the reader's section loop: E1 (no key or state decodes to None) checked "
        "for the first entry of a block only",
        part="reader",
    ),
]

#: The defects of the snapshot writer in C (numbers as in _writer.c), each caught
#: by the writer's checks in tests/test_snapshot_io.py.
WRITER_BUGS = [
    CodecBug(
        "writer-skips-an-entry-at-a-chunk-boundary",
        1,
        "the walk: the first entry of a chunk's first bucket counted, never written",
        "COWSTATE_WRITER_BUG",
        "_codec_wbug",
        "writer",
    ),
    CodecBug(
        "writer-crc-over-a-stale-buffer",
        2,
        "the block CRC: computed over the block as it was before its last entry",
        "COWSTATE_WRITER_BUG",
        "_codec_wbug",
        "writer",
    ),
    CodecBug(
        "writer-non-ascii-frame-off-by-one",
        3,
        "the entry frames: a length prefix off by one for non-ASCII strings",
        "COWSTATE_WRITER_BUG",
        "_codec_wbug",
        "writer",
    ),
    CodecBug(
        "writer-releases-a-key-group-before-encoding-it",
        4,
        "the release order: a key group released when prepared, before its block is written",
        "COWSTATE_WRITER_BUG",
        "_codec_wbug",
        "writer",
    ),
    CodecBug(
        "writer-delta-misses-changes-at-the-base-version",
        5,
        "a heap delta's walk: state_version > the base's version, not >=, so what "
        "changed before the next snapshot is left out",
        "COWSTATE_WRITER_BUG",
        "_codec_wbug",
        "writer",
    ),
    CodecBug(
        "writer-trusts-marks-of-a-later-era",
        6,
        "a heap delta's walk: a chunk's marks trusted although they start after the "
        "base (rule M: changed after a later snapshot), so its earlier changes are left out",
        "COWSTATE_WRITER_BUG",
        "_codec_wbug",
        "writer",
    ),
    CodecBug(
        "writer-freezes-a-mutable-state",
        7,
        "a heap delta's frozen changes (I6): a list or dict state held apart and its "
        "snapshot released, so the owner's in-place change after a get reaches the delta",
        "COWSTATE_WRITER_BUG",
        "_codec_wbug",
        "writer",
    ),
]

_LOADED: dict[str, ModuleType] = {}


def build_codec(bug: CodecBug | None = None) -> ModuleType:
    """Compile (once per source version) and import the codec with ``bug``
    planted, or, without one, the codec as it is. Neither links zlib: their
    CRC32 is the table-driven one (what a build without zlib.h gets)."""
    if bug is not None:
        name, defines = f"{bug.prefix}{bug.number}", [f"-D{bug.macro}={bug.number}"]
    else:
        name, defines = "_codec_tablecrc", []
    if name in _LOADED:
        return _LOADED[name]
    digest = hashlib.sha256(b"".join((SOURCES / f).read_bytes() for f in _FILES)).hexdigest()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = BUILD / digest[:12] / f"{name}{suffix}"
    if not target.exists():
        # Several processes may build the same variant at once (pytest-xdist
        # workers): each writes a file of its own and renames it into place.
        target.parent.mkdir(parents=True, exist_ok=True)
        building = target.with_name(f"{name}.{os.getpid()}.building{suffix}")
        command = [
            "cc",
            "-shared",
            "-fPIC",
            "-O1",
            "-std=c11",
            f"-I{sysconfig.get_paths()['include']}",
            *defines,
            f"-DCOWSTATE_CODEC_MODULE={name}",
            str(SOURCES / "_codecmodule.c"),
            str(SOURCES / "_codec.c"),
            str(SOURCES / "_writer.c"),
            "-o",
            str(building),
        ]
        # without the sanitizer runtimes make sanitize preloads (LeakSanitizer
        # would fail the compiler on its own leaks), as bad_cmaps builds
        clean = {k: v for k, v in os.environ.items() if k not in SANITIZER_VARIABLES}
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=clean)
        if done.returncode != 0:
            raise RuntimeError(f"building {name} failed: {' '.join(command)}\n{done.stderr}")
        os.replace(building, target)
    spec = importlib.util.spec_from_file_location(f"cowstate.{name}", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    _LOADED[name] = module
    return module
