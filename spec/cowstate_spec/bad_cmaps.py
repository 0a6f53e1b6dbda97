"""Deliberately broken C maps the specification must catch.

The pure map's broken variants (:mod:`cowstate_spec.bad_implementations`)
rewrite one line of a method; a C map is broken at compile time instead:
``impl/cowstate/_cmap.c`` plants one defect under ``-DCOWSTATE_BUG=n``. Each
variant is compiled once into ``build/bad_cmaps/`` as its own module
(``-DCOWSTATE_MODULE=_cmap_bug<n>``) and loaded beside the real one, so the
state machines drive it exactly as they drive ``cowstate._cmap``.

``build_bad_cmap(bug)`` needs a C compiler and the Python headers (as
``pip install -e .`` does); it raises ``RuntimeError`` with the compiler's
output when the build fails.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["C_BUGS", "CBug", "bad_cmap_implementation", "build_bad_cmap"]

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

_LOADED: dict[int, ModuleType] = {}


def build_bad_cmap(bug: CBug) -> ModuleType:
    """Compile (once per source version) and import the map with ``bug`` planted."""
    if bug.number in _LOADED:
        return _LOADED[bug.number]
    name = f"_cmap_bug{bug.number}"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = BUILD / digest / f"{name}{suffix}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        include = sysconfig.get_paths()["include"]
        command = [
            "cc",
            "-shared",
            "-fPIC",
            "-O1",
            "-std=c11",
            f"-I{include}",
            f"-DCOWSTATE_BUG={bug.number}",
            f"-DCOWSTATE_MODULE={name}",
            str(SOURCE),
            "-o",
            str(target),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building {bug.name} failed: {' '.join(command)}\n{done.stderr}")
    spec = importlib.util.spec_from_file_location(f"cowstate.{name}", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    _LOADED[bug.number] = module
    return module


def bad_cmap_implementation(bug: CBug, initial_capacity: int = 4) -> Any:
    """The :class:`~cowstate_spec.implementations.Implementation` of a broken C map,
    checked like the real one (structure export, fingerprints, rehash steps)."""
    from cowstate_spec.implementations import _cow

    module = build_bad_cmap(bug)
    return _cow(f"bad-{bug.name}", initial_capacity, module.CopyOnWriteStateMap)
