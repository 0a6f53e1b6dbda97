"""The import graph of ``impl/cowstate``: no cycle, no upward import, nothing of
the model or the spec; and the names the C map imports by string are the
public contract of :mod:`cowstate.map_contract`.

The graph is read from the source, not from ``sys.modules``: every module of
``impl/cowstate`` is parsed (``ast``) and every ``import`` / ``from ... import``
at any depth -- module level, inside a function (a late import), a class, a
``try`` -- is an edge. ``from p import x`` is an edge to ``p.x`` when that is a
module, else to ``p``. Python runs a package's ``__init__`` before any module
of it, so importing ``p.q.x`` from outside ``p.q`` is an edge to ``p.q`` too
(for the cycles: the order of what runs first is what a cycle breaks; the
layers judge the module an import names, since a package's ``__init__`` only
re-exports). The root package ``cowstate`` is every module's ancestor and no
one's edge that way. Imports under ``if TYPE_CHECKING:`` never run: they are
left out of (a) and (b) (``protocols.py`` names every map and table there, to
prove them), but not out of (c). The C extensions are modules too (named by
their ``.pyi``): their edges are the ``PyImport_ImportModule("...")`` calls of
their ``.c`` source, which no Python tool sees.

(a) No cycle: the graph's strongly connected components are single modules.
(b) No upward import: every module has a layer (:data:`LAYERS`, bottom up;
    CONTRIBUTING.md "Layers" shows the same table) and imports only from its
    own layer or lower ones; within a layer, (a) keeps the order.
(c) ``impl`` imports nothing of ``cowstate_model`` or ``cowstate_spec``;
    ``model`` imports nothing of ``cowstate`` or ``cowstate_spec``.

:data:`KNOWN` lists the edges still allowed to break a rule, each with the
finding it waits for; a test fails when one of them is gone, so its entry
goes with the fix. The checks are themselves checked on small planted graphs
(a late import closing a cycle, an upward import, an implicit package edge),
on the real tree with an old import put back (the value codec's, recovery's
of the coordinator, the command line's of the spec) and on a renamed name in
a copy of ``_cmap.c``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from cowstate import errors, map_contract

ROOT = Path(__file__).resolve().parents[1]
IMPL = ROOT / "impl"
MODEL = ROOT / "model"
CMAP_C = IMPL / "cowstate" / "_cmap.c"

#: The layers of ``impl/cowstate``, bottom up: a module imports from its own
#: layer or lower ones. A package's name stands for its ``__init__.py``.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "cowstate.errors",
            "cowstate.type_vars",
            "cowstate.arithmetic",
            "cowstate.key_types",
            "cowstate.void_namespace",
            "cowstate._void",
            "cowstate.collector",
            "cowstate._keygroups",
        ),
    ),
    ("values", ("cowstate.value_codec", "cowstate.serializers", "cowstate.key_groups")),
    ("vocabulary", ("cowstate.map_contract",)),
    ("maps", ("cowstate.state_map", "cowstate._cmap", "cowstate.maps", "cowstate.introspection")),
    (
        "state",
        (
            "cowstate.keyed_state",
            "cowstate.descriptors",
            "cowstate.kinds",
            "cowstate.state_meta",
            "cowstate.protocols",
        ),
    ),
    (
        "tables",
        (
            "cowstate.table_base",
            "cowstate.state_table",
            "cowstate.nested_table",
            "cowstate.rocksdb.table",
        ),
    ),
    (
        "snapshot",
        (
            "cowstate._codec",
            "cowstate.snapshot.ccodec",
            "cowstate.snapshot.format",
            "cowstate.snapshot.checks",
            "cowstate.snapshot.compat",
            "cowstate.snapshot.reader",
            "cowstate.snapshot.writer",
            "cowstate.snapshot.restore",
            "cowstate.snapshot",
        ),
    ),
    (
        "handles",
        (
            "cowstate.checkpoint.paths",
            "cowstate.checkpoint.filesystem",
            "cowstate.checkpoint.sealed",
            "cowstate.checkpoint.handles",
            "cowstate.checkpoint.location",
            "cowstate.checkpoint.protocol",
        ),
    ),
    (
        "backends",
        (
            "cowstate.keyed_backend",
            "cowstate.heap_incremental",
            "cowstate.heap_backend",
            "cowstate.rocksdb.db",
            "cowstate.rocksdb.snapshot",
            "cowstate.rocksdb.restore",
            "cowstate.rocksdb.backend",
            "cowstate.rocksdb",
        ),
    ),
    (
        "checkpoint",
        (
            "cowstate.checkpoint.registry",
            "cowstate.checkpoint.verify",
            "cowstate.checkpoint.metadata",
            "cowstate.checkpoint.storage",
            "cowstate.checkpoint.coordinator",
            "cowstate.checkpoint.recovery",
            "cowstate.checkpoint.inspect",
            "cowstate.checkpoint",
        ),
    ),
    ("api", ("cowstate",)),
    ("cli", ("cowstate.cli", "cowstate.__main__")),
)

#: Edges that still break a rule, (importer, imported): each waits for its fix,
#: which removes it here (test_every_known_exception_is_still_there).
KNOWN: dict[tuple[str, str], str] = {
    # state_table's module __getattr__ resolves the nested table's names of
    # 0.1.0 lazily (tests/test_table_contracts.py pins it): a cycle with
    # nested_table, which imports state_table; it goes with those old names.
    ("cowstate.state_table", "cowstate.nested_table"): "the nested table's 0.1.0 names",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is written, and whether it runs."""

    module: str  # the absolute dotted name imported from (``from X import ...`` or ``import X``)
    name: str | None  # ``from X import name``; None for ``import X``
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # "path:line"
    implicit: bool  # a parent package's __init__, run before the module named
    type_only: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import statement of ``source`` (the module ``module``), at any depth."""
    found: list[Import] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                visit(statement, True)
            for statement in node.orelse:  # else / elif: runs
                visit(statement, type_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, None, node.lineno, type_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing package
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.extend(Import(base, a.name, node.lineno, type_only) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(source), False)
    return found


def c_imports_of(source: str) -> list[tuple[str, int]]:
    """The modules a C extension imports, by ``PyImport_ImportModule("...")``."""
    return [
        (m.group(1), source.count("\n", 0, m.start()) + 1)
        for m in re.finditer(r'PyImport_ImportModule\("([\w.]+)"\)', source)
    ]


def edges_of(
    python: Mapping[str, tuple[str, bool, str]],
    c_sources: Mapping[str, tuple[str, str]],
    prefix: str = "cowstate",
) -> list[Edge]:
    """The edges among ``python`` (module -> (source, is_package, path)) and the C
    extensions ``c_sources`` (module -> (C source, path)), plus edges to what
    outside ``prefix`` they import (for rule c)."""
    modules = set(python) | set(c_sources)
    edges: list[Edge] = []

    def add(importer: str, target: str, where: str, type_only: bool) -> None:
        edges.append(Edge(importer, target, where, False, type_only))
        parts = target.split(".")
        for i in range(2, len(parts)):  # the parent packages Python runs first
            parent = ".".join(parts[:i])
            if parent in modules and not (importer == parent or importer.startswith(parent + ".")):
                edges.append(Edge(importer, parent, where, True, type_only))

    for module, (source, is_package, path) in python.items():
        for imp in imports_of(source, module, is_package):
            where = f"{path}:{imp.line}"
            dotted = f"{imp.module}.{imp.name}" if imp.name else imp.module
            if imp.name and dotted in modules:
                target = dotted
            elif imp.module in modules:
                target = imp.module
            elif imp.module.split(".")[0] == prefix:
                raise AssertionError(
                    f"{where}: imports {imp.module}, which is no module of {prefix}"
                )
            else:
                target = imp.module  # outside: kept for rule (c)
            if target != module:
                add(module, target, where, imp.type_only)
    for module, (c_source, path) in c_sources.items():
        for target, line in c_imports_of(c_source):
            add(module, target, f"{path}:{line}", False)
    return list(dict.fromkeys(edges))  # one per line: `from x import a, b` is one edge


def cycles(nodes: Iterable[str], edges: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    successors: dict[str, set[str]] = {n: set() for n in nodes}
    for e in edges:
        if e.imported in successors and e.importer in successors:
            successors[e.importer].add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(successors[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(successors):
        if v not in index:
            connect(v)
    return sorted(found)


def upward(edges: Iterable[Edge], layers: Mapping[str, int], names: list[str]) -> list[str]:
    """Every edge from a module to a module of a higher layer, as a line naming
    both (the module an import names: a parent package's ``__init__`` that
    Python runs first is no layer's business, see the module doc)."""
    return [
        f"{e.where}: {e.importer} ({names[layers[e.importer]]}) imports "
        f"{e.imported} ({names[layers[e.imported]]})"
        for e in edges
        if not e.implicit
        and e.importer in layers
        and e.imported in layers
        and layers[e.imported] > layers[e.importer]
    ]


def _tree(root: Path, package: str) -> dict[str, tuple[str, bool, str]]:
    """Every module of ``root/package``: dotted name -> (source, is_package, path)."""
    out: dict[str, tuple[str, bool, str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path.read_text(), is_package, str(path.relative_to(ROOT)))
    return out


def _extensions() -> dict[str, tuple[str, str]]:
    """The C extensions of cowstate (each has a ``.pyi``): module -> (C source, path)."""
    out: dict[str, tuple[str, str]] = {}
    for stub in sorted((IMPL / "cowstate").rglob("*.pyi")):
        c_file = stub.with_suffix(".c")
        parts = stub.relative_to(IMPL).with_suffix("").parts
        out[".".join(parts)] = (c_file.read_text(), str(c_file.relative_to(ROOT)))
    return out


PYTHON = _tree(IMPL, "cowstate")
EXTENSIONS = _extensions()
EDGES = edges_of(PYTHON, EXTENSIONS)
MODULES = sorted(set(PYTHON) | set(EXTENSIONS))
LAYER_NAMES = [name for name, _ in LAYERS]
LAYER_OF = {module: i for i, (_, members) in enumerate(LAYERS) for module in members}


def _running(edges: Iterable[Edge]) -> list[Edge]:
    """The edges that run, less the known exceptions."""
    return [e for e in edges if not e.type_only and (e.importer, e.imported) not in KNOWN]


# ------------------------------------------------------------- the real tree


def test_every_module_of_impl_has_exactly_one_layer() -> None:
    listed = [module for _, members in LAYERS for module in members]
    assert sorted(listed) == sorted(set(listed)), "a module in two layers"
    assert sorted(set(MODULES) - set(listed)) == [], "give each new module its layer in LAYERS"
    assert sorted(set(listed) - set(MODULES)) == [], "LAYERS names a module that is gone"


def test_contributing_names_the_layers_in_their_order() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^    (\w+)  +\S", block, flags=re.M)
    assert named == LAYER_NAMES


def test_impl_has_no_import_cycle() -> None:
    found = cycles(MODULES, _running(EDGES))
    where = {
        " <-> ".join(c): sorted(
            f"{e.where}: {e.importer} -> {e.imported}"
            for e in _running(EDGES)
            if e.importer in c and e.imported in c
        )
        for c in found
    }
    assert where == {}


def test_no_module_of_impl_imports_from_a_higher_layer() -> None:
    assert upward(_running(EDGES), LAYER_OF, LAYER_NAMES) == []


def outward(edges: Iterable[Edge]) -> list[str]:
    """Every edge from ``impl`` to the model or the spec, as a line naming both
    (type-only ones too: rule (c))."""
    return [
        f"{e.where}: {e.importer} imports {e.imported}"
        for e in edges
        if e.imported.split(".")[0] in ("cowstate_model", "cowstate_spec")
        and (e.importer, e.imported) not in KNOWN
    ]


def test_impl_imports_nothing_of_model_or_spec_and_model_nothing_of_ours() -> None:
    impl_out = outward(EDGES)
    model = edges_of(_tree(MODEL, "cowstate_model"), {}, prefix="cowstate_model")
    model_out = [
        f"{e.where}: {e.importer} imports {e.imported}"
        for e in model
        if e.imported.split(".")[0] in ("cowstate", "cowstate_spec")
    ]
    assert impl_out == [] and model_out == []
    assert any(e.imported.startswith("cowstate_model.") for e in model)  # the model was read


def test_every_known_exception_is_still_there() -> None:
    # An exception whose edge is gone was fixed: remove it from KNOWN.
    present = {(e.importer, e.imported) for e in EDGES}
    assert [edge for edge in KNOWN if edge not in present] == []


def test_the_maps_share_the_vocabulary_and_only_the_map_choice_imports_the_pure_map() -> None:
    # Issue 27 finding 3: the C map, the tables and state_meta imported the
    # pure map for its entry record and helpers; now the pure map is imported
    # by what chooses or inspects a map, and the rest imports map_contract,
    # which imports only errors, arithmetic, serializers and type_vars (its
    # docstring's rule). _cmap.c's imports by string are edges too.
    importers = {e.importer for e in _running(EDGES) if e.imported == "cowstate.state_map"}
    assert importers == {"cowstate.maps", "cowstate.introspection"}  # protocols: type-only
    assert {e.imported for e in EDGES if e.importer == "cowstate._cmap"} == {
        "cowstate.errors",
        "cowstate.map_contract",
    }
    ours = {e.imported for e in EDGES if e.importer == "cowstate.map_contract"} & set(MODULES)
    assert ours == {
        "cowstate.errors",
        "cowstate.arithmetic",
        "cowstate.serializers",
        "cowstate.type_vars",
    }


def _with(module: str, extra: str) -> list[Edge]:
    """The real tree's edges with ``extra`` appended to ``module``'s source."""
    source, is_package, path = PYTHON[module]
    return edges_of({**PYTHON, module: (source + extra, is_package, path)}, EXTENSIONS)


def test_the_value_codecs_old_late_import_of_void_namespace_is_caught() -> None:
    # Issue 27 finding 5: value_codec read VOID_NAMESPACE from keyed_state
    # inside a function; put back, it is a cycle and an upward import.
    edges = _running(
        _with("cowstate.value_codec", "def _void():\n    from cowstate.keyed_state import X\n")
    )
    # (keyed_state imports more since the direct route: the cycle is longer)
    assert any(
        {"cowstate.keyed_state", "cowstate.value_codec"} <= set(cycle)
        for cycle in cycles(MODULES, edges)
    )
    assert [u.split(": ", 1)[1] for u in upward(edges, LAYER_OF, LAYER_NAMES)] == [
        "cowstate.value_codec (values) imports cowstate.keyed_state (state)"
    ]


def test_recoverys_old_late_import_of_the_coordinator_is_caught() -> None:
    # Issue 27 finding 5: recovery made the coordinator's CompletedCheckpoint
    # inside run(); now it reaches the coordinator only through RecoverableJob.
    # Put back, the import closes a cycle with the coordinator, which runs it.
    edges = _running(
        _with(
            "cowstate.checkpoint.recovery",
            "def _late():\n    from cowstate.checkpoint.coordinator import CompletedCheckpoint\n",
        )
    )
    assert cycles(MODULES, edges) == [
        ["cowstate.checkpoint.coordinator", "cowstate.checkpoint.recovery"]
    ]


def test_the_clis_old_late_import_of_the_spec_is_caught() -> None:
    # Issue 27 finding 6: `cowstate check` imported the spec's main; now the
    # spec registers the command (entry point group cowstate.commands).
    edges = _with("cowstate.cli", "def _check():\n    from cowstate_spec.cli import main\n")
    assert [line.split(": ", 1)[1] for line in outward(edges)] == [
        "cowstate.cli imports cowstate_spec.cli"
    ]


def test_a_table_vocabulary_taken_from_the_pure_map_again_is_caught() -> None:
    # Issue 27 finding 3: state_meta re-exported the pure map's StateEntry.
    edges = _with("cowstate.state_meta", "from cowstate.state_map import StateEntry\n")
    importers = {e.importer for e in _running(edges) if e.imported == "cowstate.state_map"}
    assert importers == {"cowstate.maps", "cowstate.introspection", "cowstate.state_meta"}


# ---------------------------------------------- what _cmap.c imports by string


def c_lookups(source: str) -> list[tuple[str, str]]:
    """``(module, name)`` for every ``lookup_attr(var, "name", ...)`` and
    ``lookup_method(var, "class", "method", ...)`` of a C source whose ``var``
    holds a ``PyImport_ImportModule("module")`` (the method as ``class.method``)."""
    variables = dict(
        re.findall(r'PyObject \*(\w+) = [^;]*?PyImport_ImportModule\("([\w.]+)"\)', source)
    )
    found: list[tuple[str, str]] = []
    for call in re.finditer(r'lookup_(attr|method)\((\w+), ("[^)]*?)&\w+\)', source):
        kind, variable, quoted = call.groups()
        names = re.findall(r'"(\w+)"', quoted)
        assert variable in variables, f"lookup_{kind} on {variable}, not an imported module"
        assert len(names) == (1 if kind == "attr" else 2), call.group(0)
        found.append((variables[variable], ".".join(names)))
    return found


def not_public(lookups: Iterable[tuple[str, str]]) -> list[str]:
    """The lookups whose name is not in its module's ``__all__`` (for a method:
    the class is, and has the method)."""
    modules = {"cowstate.errors": errors, "cowstate.map_contract": map_contract}
    missing: list[str] = []
    for module_name, dotted in lookups:
        module = modules[module_name]
        first, _, rest = dotted.partition(".")
        public = first in module.__all__ and (not rest or hasattr(getattr(module, first), rest))
        if not public:
            missing.append(f"{module_name}.{dotted}")
    return missing


CMAP_SOURCE = CMAP_C.read_text()


def test_every_name_the_c_map_imports_is_public_in_its_module() -> None:
    lookups = c_lookups(CMAP_SOURCE)
    calls = len(re.findall(r"\| lookup_(?:attr|method)\(|= lookup_(?:attr|method)\(", CMAP_SOURCE))
    assert len(lookups) == calls  # every lookup in PyInit was read
    assert {m for m, _ in lookups} == {"cowstate.errors", "cowstate.map_contract"}
    assert ("cowstate.map_contract", "StateEntry") in lookups
    assert not_public(lookups) == []
    assert all(not name.startswith("_") for _, name in lookups)


@pytest.mark.parametrize(
    ("old", "new", "missing"),
    [
        # first, in the middle and last of the lookups from map_contract
        ('"StateEntry"', '"_StateEntry"', "cowstate.map_contract._StateEntry"),
        ('"pair_message"', '"_pair_message"', "cowstate.map_contract._pair_message"),
        ('"reentrant_message"', '"reentrant_msg"', "cowstate.map_contract.reentrant_msg"),
        (
            '"of", &fn_state_copy_error',
            '"off", &fn_state_copy_error',
            "cowstate.errors.StateCopyError.off",
        ),
    ],
)
def test_a_name_renamed_on_one_side_fails_the_check(old: str, new: str, missing: str) -> None:
    planted = CMAP_SOURCE.replace(old, new)
    assert planted != CMAP_SOURCE
    assert not_public(c_lookups(planted)) == [missing]


def test_a_name_the_vocabulary_no_longer_exports_fails_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        map_contract, "__all__", [n for n in map_contract.__all__ if n != "none_message"]
    )
    assert not_public(c_lookups(CMAP_SOURCE)) == ["cowstate.map_contract.none_message"]


# ------------------------------------------- the checks on planted graphs


def _planted(sources: dict[str, str], packages: Iterable[str] = ()) -> list[Edge]:
    return edges_of(
        {m: (s, m in set(packages), f"{m}.py") for m, s in sources.items()}, {}, prefix="p"
    )


def test_a_late_import_closing_a_cycle_is_found_and_a_type_only_one_is_not() -> None:
    edges = _planted(
        {
            "p.a": "import p.b\n",
            "p.b": "def f():\n    from p import c\n",
            "p.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import x\n",
            "p.d": "try:\n    from p.e import y\nexcept ImportError:\n    pass\n",
            "p.e": "class K:\n    def m(self):\n        import p.d\n",
        }
    )
    assert cycles(["p.a", "p.b", "p.c", "p.d", "p.e"], _running(edges)) == [["p.d", "p.e"]]
    closing = [e for e in edges if (e.importer, e.imported) == ("p.c", "p.a")]
    assert [e.type_only for e in closing] == [True]
    assert cycles(["p.a", "p.b", "p.c"], edges) == [["p.a", "p.b", "p.c"]]  # were it to run


def test_importing_a_module_of_a_package_runs_the_package_first() -> None:
    # p.q's __init__ imports p.low; p.low imports p.q.x: a cycle through p.q.
    edges = _planted(
        {
            "p.q": "from p.q.x import y\n",
            "p.q.x": "import p.low\n",
            "p.low": "from p.q.x import y\n",
        },
        packages=["p.q"],
    )
    assert [(e.importer, e.imported) for e in edges if e.implicit] == [("p.low", "p.q")]
    assert cycles(["p.q", "p.q.x", "p.low"], edges) == [["p.low", "p.q", "p.q.x"]]


def test_an_upward_import_is_named_with_both_layers() -> None:
    edges = _planted(
        {
            "p.low": "x = 1\n",
            "p.mid": "import p.low\n",
            "p.top": "from p import mid\n",
            "p.bad": "def f():\n    from p.top import z\n",
        }
    )
    layers = {"p.low": 0, "p.bad": 0, "p.mid": 1, "p.top": 2}
    assert upward(edges, layers, ["one", "two", "three"]) == [
        "p.bad.py:2: p.bad (one) imports p.top (three)"
    ]


def test_a_relative_import_is_resolved_against_its_package() -> None:
    edges = _planted(
        {"p.q": "from . import x\n", "p.q.x": "from .. import low\n", "p.low": ""},
        packages=["p.q"],
    )
    assert [(e.importer, e.imported) for e in edges] == [("p.q", "p.q.x"), ("p.q.x", "p.low")]


def test_an_import_of_a_module_that_does_not_exist_is_refused() -> None:
    with pytest.raises(
        AssertionError, match=r"p\.a\.py:1: imports p\.gone, which is no module of p"
    ):
        _planted({"p.a": "from p.gone import x\n"})
