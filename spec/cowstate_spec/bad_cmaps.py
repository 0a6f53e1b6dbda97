"""Deliberately broken C maps the specification must catch.

The pure map's broken variants (:mod:`cowstate_spec.bad_implementations`)
rewrite one line of a method; a C map is broken at compile time instead:
``impl/cowstate/_cmap.c`` plants one defect under ``-DCOWSTATE_BUG=n`` (each
site is a ``PLANTED(BUG_...)`` condition there). Each variant is compiled once
into ``build/bad_cmaps/`` as its own module (``-DCOWSTATE_MODULE=_cmap_bug<n>``)
and loaded beside the real one, then attached to the probe
(``cowstate_spec._cmap_probe.attach``: same layout, its own types), so the
state machines drive it and the probe's checker judges it exactly as they do
``cowstate._cmap``.

Defects ``_cmap.c`` does not plant under a number are :class:`CRewrite` objects:
one exact text of the source (one occurrence) replaced, in a copy compiled
the same way (``-DCOWSTATE_MODULE=_cmap_rw_<name>``) -- the C form of the pure
map's one-line bugs. Each has an identity control (the text replaced by
itself), which the machine must pass: all of them one build, the source as
it is compiled the same way (``_cmap_rw_identity``).

**Caught before memory goes wrong.** A planted C defect must be named by
a check before it makes the map read or write memory it freed: a defect
that crashes the interpreter first (or loops on a chain through reused
memory) is found by ``make sanitize``, not by the specification, and it
takes a test process down with it. So the rehash relinking a shared entry
in place is not planted (below), and bugs 5 and 7 are safe because the
differential runner judges a C map's structure before each release's read
(:mod:`cowstate_spec.differential`, "Structure first") and because rule P's
trim to 0 frees every spare the list holds, whatever the count says.
``tests/test_spec_catches_bad_cmaps.py`` holds the runner to it: it meets
every planted bug in a process that poisons what is freed.

``build_bad_cmap(bug)`` needs a C compiler and the Python headers (as
``pip install -e .`` does); it raises ``RuntimeError`` with the compiler's
output when the build fails.
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
from typing import Any

import cowstate

__all__ = [
    "C_BUGS",
    "C_REWRITES",
    "C_TRACKING_REWRITES",
    "LEAK_PROBE",
    "CBug",
    "CRewrite",
    "bad_cmap_implementation",
    "build_bad_cmap",
    "c_identity",
]

#: The C map's source beside the cowstate package in use (impl/cowstate, or the
#: copy make sanitize instruments in build/sanitize/cowstate).
SOURCE = Path(cowstate.__file__).resolve().parent / "_cmap.c"
#: The layout both the map and the probe compile in.
HEADER = SOURCE.with_name("_cmap.h")
BUILD = Path(__file__).resolve().parents[2] / "build" / "bad_cmaps"


@dataclass(frozen=True)
class CBug:
    """One planted defect: its ``COWSTATE_BUG`` number and the rule it breaks."""

    name: str
    number: int
    breaks: str


#: The defects of the C map the spec must each catch (numbers as in _cmap.c).
C_BUGS = [
    CBug("c-get-skips-state-copy", 1, "rule S: get hands out a state a snapshot still holds"),
    CBug(
        "c-relinks-shared-predecessor",
        2,
        "rule E: remove rewrites a shared predecessor's next in place",
    ),
    CBug(
        "c-writes-shared-chunk",
        3,
        "rule C: a bucket slot of a chunk a snapshot holds is written in place",
    ),
    CBug(
        "c-directory-copy-misses-a-chunk",
        4,
        "snapshot: the directory copy leaves out its last chunk",
    ),
    CBug(
        "c-release-forgets-open-snapshot",
        5,
        "release: H drops to 0 although older snapshots are still open",
    ),
    CBug(
        "c-put-leaks-replaced-state",
        6,
        "put never drops its reference to the state it replaced: a leak on a hot path",
    ),
    CBug(
        "c-spare-uncounted",
        7,
        "rule P: a chunk kept as a spare is not counted: the map keeps spares past its bound "
        "(one per directory slot) until it is cleared or its chunk size changes",
    ),
]


@dataclass(frozen=True)
class CRewrite:
    """One defect planted by text: ``old`` (exactly one occurrence in ``_cmap.c``)
    becomes ``new`` in the copy that is compiled."""

    name: str
    old: str
    new: str
    breaks: str
    #: The map tracks changes (rules T and D): the machine's ChangeTracking
    #: rules check it (the pure map's ``Bug.tracked``).
    tracked: bool = False


#: The C forms of the pure map's bugs ``_cmap.c`` has no number for. Not the
#: rehash relinking a shared entry in place: in C that lets a snapshot reach
#: entries freed later (a use-after-free that crashes the interpreter instead
#: of failing an assertion), which is what ``make sanitize`` is for.
C_REWRITES = [
    CRewrite(
        "c-get-checks-entry-version",
        "if (e->state_version < m->guard && !(m->scalars_as_is && is_scalar_state(e->state))",
        "if (e->entry_version < m->guard && !(m->scalars_as_is && is_scalar_state(e->state))",
        "rule S asks the state's version: a rule E copy still holds the snapshot's state",
    ),
    CRewrite(
        "c-scalar-exemption-takes-lists",
        "|| PyBytes_CheckExact(o) || PyBool_Check(o) || PyComplex_CheckExact(o);",
        "|| PyBytes_CheckExact(o) || PyBool_Check(o) || PyComplex_CheckExact(o)\n"
        "        || PyList_Check(o);",
        "rule S's scalar exemption hands out a list a snapshot holds: mutating it "
        "changes the snapshot",
    ),
    CRewrite(
        "c-select-active-table-off-by-one",
        "b < m->rehash_index) {",
        "b < m->rehash_index + 1) {",
        "a bucket is looked up in the rehash table before it moved",
    ),
    CRewrite(
        "c-remove-skips-modification-count",
        "    m->mod_count++;\n    if (t == &m->primary)\n        m->primary_size--;",
        "    if (t == &m->primary)\n        m->primary_size--;",
        "an iterator must fail fast after a removal",
    ),
    CRewrite(
        "c-rehash-forgets-moved-count",
        "    m->primary_size -= moved;\n    m->rehash_size += moved;\n"
        "    m->rehash_index = r;\n    return 0;",
        "    m->primary_size -= moved;\n    m->rehash_size += moved - 1;\n"
        "    m->rehash_index = r;\n    return 0;",
        "per-table counters drift (invariant 3)",
    ),
]


#: The C forms of the pure map's change-tracking bugs (``tracked``: the map
#: tracks changes, and the machine's ChangeTracking rules catch them), and two
#: of rule M's marks, which only the C map keeps (invariant 14 of both checkers
#: catches them). Apart from C_REWRITES: a map that does not track (the
#: differential runner's, the checkers' replay) cannot show them.
C_TRACKING_REWRITES = [
    CRewrite(
        "c-get-mutation-not-recorded",
        "            e = mark_state(m, &f, e);\n"
        "            return e == NULL ? NULL : Py_NewRef(e->state);",
        "            return Py_NewRef(e->state);",
        "rule T: a state get hands out after the base is not marked, so a caller's "
        "mutation is missing from the next delta",
        tracked=True,
    ),
    CRewrite(
        "c-remove-not-logged",
        "        log_removal(m, e->key, e->ns, dropped);   /* rule D */",
        "        (void)dropped;",
        "rule D: a removal missing from the log, so the next delta keeps the key",
        tracked=True,
    ),
    CRewrite(
        "c-release-guard-ignores-tracking",
        "    set_guard(m);                                     "
        "/* inv. 13: H, or V while tracking */",
        "    m->guard = m->highest;",
        "rule T: after the base is released get no longer marks what it hands out",
        tracked=True,
    ),
    CRewrite(
        "c-put-does-not-mark-its-bucket",
        "    e->state_version = m->version;\n"
        "    mark_bucket(m, f->table, f->bucket, m->version);          /* rule M */",
        "    e->state_version = m->version;\n    (void)f;",
        "rule M: a put's bucket is not marked, so a delta that walks its chunk by the "
        "marks leaves the change out",
        tracked=True,
    ),
    CRewrite(
        "c-rehash-drops-marks",
        "        mark_bucket(m, new, pos, (*dst)->state_version);     "
        "/* rule M: its chunk is private */\n",
        "",
        "rule M: the rehash moves changed entries into chunks that do not mark them",
        tracked=True,
    ),
]


#: Memory only, so no machine can see it: ``entry_free`` drops the entry's key,
#: namespace and state but never frees the entry itself. The traced memory of
#: the leak tests (tests/test_implementations.py) and LeakSanitizer's self-check
#: in ``make sanitize`` (scripts/sanitize.sh) must each report it.
LEAK_PROBE = CRewrite(
    "c-entry-free-keeps-the-entry",
    "    PyObject *key = e->key, *ns = e->ns, *state = e->state;\n    PyMem_Free(e);\n",
    "    PyObject *key = e->key, *ns = e->ns, *state = e->state;\n",
    "a removed or replaced entry's 48 bytes are never freed",
)


def c_identity(bug: CRewrite) -> CRewrite:
    """The control of ``bug``: its text replaced by itself."""
    return CRewrite(f"identity-{bug.name}", bug.old, bug.old, "control", bug.tracked)


_LOADED: dict[int | tuple[str, ...], ModuleType] = {}
SANITIZER_VARIABLES = frozenset(
    {"LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC"}
)


def build_bad_cmap(bug: CBug | CRewrite) -> ModuleType:
    """Compile (once per source version) and import the map with ``bug`` planted.
    Every identity control (a text replaced by itself) is the same copy, the
    source as it is: one build (``_cmap_rw_identity``) serves them all."""
    text = SOURCE.read_text()
    if isinstance(bug, CRewrite) and text.count(bug.old) != 1:
        raise ValueError(
            f"bug {bug.name}: expected exactly one {bug.old!r} in {SOURCE.name}, "
            f"found {text.count(bug.old)}"
        )
    identity = isinstance(bug, CRewrite) and bug.old == bug.new
    key: int | tuple[str, ...] = (
        bug.number
        if isinstance(bug, CBug)
        else ("identity",)
        if identity
        else (bug.name, bug.old, bug.new)
    )
    if key in _LOADED:
        return _LOADED[key]
    if isinstance(bug, CBug):
        name = f"_cmap_bug{bug.number}"
        source, defines = SOURCE, [f"-DCOWSTATE_BUG={bug.number}"]
    else:
        name = "_cmap_rw_identity" if identity else "_cmap_rw_" + bug.name.replace("-", "_")
        defines = []
    # The rewrite's own text too: a rewrite changed in place is a new variant.
    planted = b"" if isinstance(bug, CBug) or identity else f"{bug.old}\0{bug.new}".encode()
    digest = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes() + planted).hexdigest()[:12]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = BUILD / digest / f"{name}{suffix}"
    if not target.exists():
        # Several processes may build the same variant at once (pytest-xdist
        # workers): each writes files of its own and renames the module into
        # place, so nobody loads a half-written one.
        target.parent.mkdir(parents=True, exist_ok=True)
        building = target.with_name(f"{name}.{os.getpid()}.building{suffix}")
        if isinstance(bug, CRewrite):
            source = target.with_name(f"{name}.{os.getpid()}.c")
            source.write_text(text.replace(bug.old, bug.new))
        include = sysconfig.get_paths()["include"]
        command = [
            "cc",
            "-shared",
            "-fPIC",
            "-O1",
            "-std=c11",
            f"-I{include}",
            f"-I{SOURCE.parent}",  # a rewritten copy includes what _cmap.c does
            *defines,
            f"-DCOWSTATE_MODULE={name}",
            str(source),
            "-o",
            str(building),
        ]
        # The compiler runs without the sanitizer runtimes make sanitize preloads
        # into this process (LeakSanitizer would fail cc for its own leaks).
        clean = {k: v for k, v in os.environ.items() if k not in SANITIZER_VARIABLES}
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=clean)
        if done.returncode != 0:
            raise RuntimeError(f"building {bug.name} failed: {' '.join(command)}\n{done.stderr}")
        os.replace(building, target)
        if isinstance(bug, CRewrite):
            os.replace(source, target.with_name(f"{name}.c"))  # kept beside it, to read
    spec = importlib.util.spec_from_file_location(f"cowstate.{name}", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from cowstate_spec.cmap_view import PROBE

    if PROBE is not None:  # its maps are checked like cowstate._cmap's
        PROBE.attach(module)
    _LOADED[key] = module
    return module


def bad_cmap_implementation(bug: CBug | CRewrite, initial_capacity: int = 4) -> Any:
    """The :class:`~cowstate_spec.implementations.Implementation` of a broken C map,
    checked like the real one (structure export, fingerprints, rehash steps)."""
    from cowstate_spec.implementations import _cow

    module = build_bad_cmap(bug)
    tracked = isinstance(bug, CRewrite) and bug.tracked
    return _cow(
        f"bad-{bug.name}",
        initial_capacity,
        module.CopyOnWriteStateMap,
        tracked=tracked,
        memory_unsafe=True,
    )
