"""Deliberately broken C maps the specification must catch.

The pure map's broken variants (:mod:`cowstate_spec.bad_implementations`)
rewrite one line of a method; a C map is broken at compile time instead:
``impl/cowstate/_cmap.c`` plants one defect under ``-DCOWSTATE_BUG=n``. Each
variant is compiled once into ``build/bad_cmaps/`` as its own module
(``-DCOWSTATE_MODULE=_cmap_bug<n>``) and loaded beside the real one, so the
state machines drive it exactly as they drive ``cowstate._cmap``.

Defects ``_cmap.c`` does not plant under a number are :class:`CRewrite` objects:
one exact text of the source (one occurrence) replaced, in a copy compiled
the same way (``-DCOWSTATE_MODULE=_cmap_rw_<name>``) -- the C form of the pure
map's one-line bugs. Each has an identity control (the text replaced by
itself), which the machine must pass.

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

__all__ = [
    "C_BUGS",
    "C_REWRITES",
    "CBug",
    "CRewrite",
    "bad_cmap_implementation",
    "build_bad_cmap",
    "c_identity",
]

SOURCE = Path(__file__).resolve().parents[2] / "impl" / "cowstate" / "_cmap.c"
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
]


@dataclass(frozen=True)
class CRewrite:
    """One defect planted by text: ``old`` (exactly one occurrence in ``_cmap.c``)
    becomes ``new`` in the copy that is compiled."""

    name: str
    old: str
    new: str
    breaks: str


#: The C forms of the pure map's bugs ``_cmap.c`` has no number for. Not the
#: rehash relinking a shared entry in place: in C that lets a snapshot reach
#: entries freed later (a use-after-free that crashes the interpreter instead
#: of failing an assertion), which is what ``make sanitize`` is for.
C_REWRITES = [
    CRewrite(
        "c-get-checks-entry-version",
        "    if (e->state_version < m->highest) {                      /* rule S */\n"
        "        PyObject *copy = copy_shared_state(m, e->state, args[0], args[1]);",
        "    if (e->entry_version < m->highest) {                      /* rule S */\n"
        "        PyObject *copy = copy_shared_state(m, e->state, args[0], args[1]);",
        "rule S asks the state's version: a rule E copy still holds the snapshot's state",
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


def c_identity(bug: CRewrite) -> CRewrite:
    """The control of ``bug``: its text replaced by itself."""
    return CRewrite(f"identity-{bug.name}", bug.old, bug.old, "control")


_LOADED: dict[int | str, ModuleType] = {}


def build_bad_cmap(bug: CBug | CRewrite) -> ModuleType:
    """Compile (once per source version) and import the map with ``bug`` planted."""
    key: int | str = bug.number if isinstance(bug, CBug) else bug.name
    if key in _LOADED:
        return _LOADED[key]
    text = SOURCE.read_text()
    if isinstance(bug, CBug):
        name = f"_cmap_bug{bug.number}"
        source, defines = SOURCE, [f"-DCOWSTATE_BUG={bug.number}"]
    else:
        if text.count(bug.old) != 1:
            raise ValueError(
                f"bug {bug.name}: expected exactly one {bug.old!r} in {SOURCE.name}, "
                f"found {text.count(bug.old)}"
            )
        name = "_cmap_rw_" + bug.name.replace("-", "_")
        defines = []
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
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
        done = subprocess.run(command, capture_output=True, text=True, check=False)
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
    _LOADED[key] = module
    return module


def bad_cmap_implementation(bug: CBug | CRewrite, initial_capacity: int = 4) -> Any:
    """The :class:`~cowstate_spec.implementations.Implementation` of a broken C map,
    checked like the real one (structure export, fingerprints, rehash steps)."""
    from cowstate_spec.implementations import _cow

    module = build_bad_cmap(bug)
    return _cow(f"bad-{bug.name}", initial_capacity, module.CopyOnWriteStateMap)
