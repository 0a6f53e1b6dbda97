"""Checking someone else's implementation: the specification as a conformance suite.

The state machines, the differential runner and ``cowstate check`` judge any
implementation of the map API against the reference model, not only
cowstate's. Three routes (the README's "Check your own implementation"):

1. **A Python factory in a test.** :func:`machine_for` returns the
   Hypothesis state machine for a factory (its ``TestCase`` is what pytest
   collects), :func:`check_differential` runs random workloads against the
   model in process; the pytest plug-in (:mod:`cowstate_spec.pytest_plugin`,
   registered under the ``pytest11`` entry point) does both through the
   ``cowstate_conformance`` fixture, so a test file is three lines.
2. **``cowstate check --implementation package.module:factory``.** The
   driver imports the factory (the current directory is on the path); the
   executors import it from an archive of its top-level package shipped
   with the run (:func:`cowstate_spec.shipping.ship_modules`). The attribute
   is a factory, or an :class:`~cowstate_spec.implementations.Implementation`
   made by :func:`implementation` (with its capabilities and checker).
3. **The process protocol** (``docs/protocol.md``) for implementations in
   any language: ``process:COMMAND`` (:mod:`cowstate_spec.process_impl`).

The map API the machines drive (cowstate's ``CopyOnWriteStateMap`` is the
example): ``put(k, n, s)`` (True if the mapping is new), ``get``,
``contains_key``, ``put_and_get_old``, ``remove``, ``remove_and_get_old``,
``transform(k, n, value, fn)`` (``fn(old_or_None, value)``; atomic: a
raising ``fn`` or one returning ``None`` changes nothing), ``len()``,
iteration yielding ``(key, namespace, state)``, ``keys(namespace)``,
``size_of_namespace(namespace)``, and ``snapshot()`` returning an object
that iterates ``(key, namespace, state)``, has ``len()`` and ``release()``
(``version`` and ``is_released`` are read where present). A factory is
called with ``initial_capacity=N`` where it takes that argument. A table's
API is :class:`cowstate.protocols.KeyedTable` with cowstate's table
snapshots.

**Capabilities.** :class:`~cowstate_spec.implementations.Capabilities` says
where an implementation departs from cowstate's contract (no snapshots,
``put`` returning nothing, copies from ``get``, no fail-fast iteration,
``None`` accepted as a state, states kept after they are replaced or
removed) and how it refuses bad input (its own
exception types). The checks that need what an implementation lacks are
skipped, never failed; :func:`skipped_checks` names them, and every route
reports them (the machine class's ``skipped_checks``, the pytest terminal
summary, ``summary.json`` and the console report of ``cowstate check``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cowstate.key_groups import KeyGroupRange
from cowstate_spec.differential import WorkloadResult, minimize, run_workload
from cowstate_spec.implementations import (
    HEAP,
    Capabilities,
    Checker,
    Fingerprinter,
    Implementation,
    TableType,
    table_implementation,
)
from cowstate_spec.workloads import WorkloadSpec, encode, operations, preset

__all__ = [
    "CHECKS",
    "Capabilities",
    "ConformanceFailure",
    "Implementation",
    "backend_machine_for",
    "check_differential",
    "factory_implementation",
    "implementation",
    "is_external_name",
    "is_factory_name",
    "machine_for",
    "skipped_checks",
]

#: The checks a missing capability skips, by the capability; what reports name.
CHECKS: dict[str, str] = {
    "snapshots": "snapshots (their contents at every step and at release in any order, "
    "and the copies rule S makes while one is open)",
    "put_reports_insert": "put's result (True for a new mapping, False for a replaced one)",
    "mutations_persist": "a state mutated in place after get stays mutated",
    "fail_fast": "iterators failing fast across an insert, a remove or a rehash step",
    "refuses_none": "put of None refused",
    "frees_states": "a leaked reference (a state replaced or removed, held by no open "
    "snapshot, must have no reference left)",
    "structure": "structural invariants and snapshot fingerprints (no checker given)",
    "rehash": "the rules aimed at a running rehash (the implementation's rehash is not visible)",
}

#: ``package.module:attribute`` (dotted attribute paths too).
_FACTORY_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ConformanceFailure(AssertionError):
    """An implementation disagrees with the model; the message holds the
    minimized operations, replayable with :func:`run_workload`
    (``operations``: the same, encoded as :func:`~cowstate_spec.workloads.encode` does)."""

    def __init__(self, message: str, operations: list[list[Any]]) -> None:
        super().__init__(message)
        self.operations = operations


def implementation(
    factory: Callable[..., Any],
    capabilities: Capabilities | None = None,
    *,
    name: str | None = None,
    check: Checker | None = None,
    fingerprint: Fingerprinter | None = None,
    table: bool = False,
    close: Callable[[Any], None] | None = None,
) -> Implementation:
    """``factory`` as the spec checks it: a map (or, with ``table``, a state
    table made as ``factory(key_group_range, max_parallelism, *, meta,
    key_serializer, initial_capacity)``) with ``capabilities`` (the heap
    map's by default), the structural ``check(instance, fingerprints)`` and
    snapshot ``fingerprint`` if it has internals worth checking (capabilities
    default to the factory's ``cowstate_capabilities``, else the heap map's), and
    ``close(instance)`` to free what the factory took."""
    capabilities = capabilities or getattr(factory, "cowstate_capabilities", None) or HEAP
    name = name or _name_of(factory)
    if table:
        table_type = TableType(
            name,
            factory,
            check=check,
            fingerprint=fingerprint,
            capabilities=capabilities,
            close=close or _keep,
        )
        return table_implementation(table_type, None, name=name)
    return Implementation(
        name,
        _with_capacity(factory),
        check=check,
        fingerprint=fingerprint,
        capabilities=capabilities,
        close=close or _keep,
    )


def machine_for(
    factory: Callable[..., Any] | Implementation,
    capabilities: Capabilities | None = None,
    **options: Any,
) -> Any:
    """The state machine class that checks ``factory`` against the model
    (``options`` as for :func:`implementation`); its ``TestCase`` runs it under
    pytest or unittest, its ``skipped_checks`` names what it cannot check."""
    from cowstate_spec.machine import machine_for as _machine_for

    target = _implementation_of(factory, capabilities, options)
    machine = _machine_for(target)
    machine.skipped_checks = skipped_checks(target)
    return machine


def backend_machine_for(
    factory: Callable[[KeyGroupRange, int], Any],
    key_group_range: KeyGroupRange | None = None,
    *,
    name: str | None = None,
    mutations_persist: bool = True,
    snapshot: Callable[..., Any] | None = None,
    read: Callable[[Any, Any], Any] | None = None,
) -> Any:
    """The backend state machine class for a keyed state backend made by
    ``factory(key_group_range, max_parallelism)`` over ``key_group_range``
    (default: key groups 0-7 of 8) (the API of cowstate's
    ``HeapKeyedStateBackend``); ``snapshot`` and ``read`` as in
    :class:`cowstate_spec.backends.BackendImplementation` where its snapshots
    are not heap snapshot files; ``mutations_persist`` false where its states
    are copies (RocksDB)."""
    from cowstate_spec.backend_machine import backend_machine_for as _backend_machine_for
    from cowstate_spec.backends import BackendImplementation

    options: dict[str, Any] = {"mutations_persist": mutations_persist}
    if snapshot is not None:
        options["snapshot"] = snapshot
    if read is not None:
        options["read"] = read
    backend = BackendImplementation(name or _name_of(factory), factory, **options)
    machine = _backend_machine_for(backend, key_group_range or KeyGroupRange(0, 7))
    machine.skipped_checks = [] if mutations_persist else [CHECKS["mutations_persist"]]
    return machine


def skipped_checks(target: Implementation) -> list[str]:
    """The checks the spec skips for ``target``, for what it lacks (each a
    phrase of :data:`CHECKS`), in the order of :data:`CHECKS`."""
    from cowstate_spec.cmap_view import MAP_CLASSES

    process = getattr(target, "skipped_process_checks", None)
    capabilities = target.capabilities
    skipped = [
        CHECKS[flag]
        for flag in ("snapshots", "put_reports_insert", "mutations_persist", "fail_fast")
        if not getattr(capabilities, flag)
    ]
    if not capabilities.refuses_none:
        skipped.append(CHECKS["refuses_none"])
    if not capabilities.frees_states and not target.table:
        skipped.append(CHECKS["frees_states"])
    if process is not None:
        return skipped + list(process())
    if target.check is None:
        skipped.append(CHECKS["structure"])
    if not target.table and capabilities.snapshots:
        instance = target.create()
        try:
            if not isinstance(instance, MAP_CLASSES):
                skipped.append(CHECKS["rehash"])
        finally:
            target.close(instance)
    return skipped


def check_differential(
    target: Implementation | Callable[..., Any],
    capabilities: Capabilities | None = None,
    *,
    spec: WorkloadSpec | None = None,
    workloads: int | None = None,
) -> list[WorkloadResult]:
    """Run the workloads of ``spec`` (default: the ``tiny`` preset, or its first
    ``workloads``) against ``target`` and the model in this process; return
    the results, or raise :class:`ConformanceFailure` at the first divergence
    with its operations minimized (replayable as the message shows)."""
    implementation_ = _implementation_of(target, capabilities, {})
    spec = spec or preset("tiny")
    count = spec.workloads if workloads is None else workloads
    results = []
    for index in range(count):
        ops = operations(spec, index)
        result = run_workload(
            implementation_,
            ops,
            workload=index,
            check_every=spec.check_every,
            initial_capacity=spec.initial_capacity,
        )
        if result.diverged:
            minimal = minimize(implementation_, ops, initial_capacity=spec.initial_capacity)
            replay = run_workload(
                implementation_, minimal, check_every=1, initial_capacity=spec.initial_capacity
            )
            raise ConformanceFailure(
                _failure_message(implementation_, spec, index, minimal, replay),
                [encode(op) for op in minimal],
            )
        results.append(result)
    return results


def is_external_name(name: str) -> bool:
    """True for the names of implementations that are not cowstate's:
    ``package.module:factory``, ``process:COMMAND`` and the protocol adapters."""
    from cowstate_spec.process_impl import is_process_name

    return is_process_name(name) or is_factory_name(name)


def is_factory_name(name: str) -> bool:
    """True for ``package.module:factory`` (not ``process:...``)."""
    return not name.startswith("process:") and bool(_FACTORY_NAME.match(name))


def factory_implementation(name: str) -> Implementation:
    """The implementation ``package.module:attribute`` names: the attribute is an
    :class:`Implementation` or a factory (whose ``cowstate_capabilities``, if
    it has them, are its capabilities). The module is imported from the
    environment or the current directory. Raises ``KeyError`` saying what was
    expected and what was found."""
    module_name, _, attribute = name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise KeyError(
            f"implementation {name!r}: cannot import {module_name!r} ({exc}); expected "
            "package.module:factory importable from the environment or the current directory"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise KeyError(
                f"implementation {name!r}: module {module_name!r} has no {attribute!r}; "
                "expected package.module:factory naming a factory or an Implementation"
            )
        target = getattr(target, part)
    if isinstance(target, Implementation):
        return dataclasses.replace(target, name=name)
    if not callable(target):
        raise KeyError(
            f"implementation {name!r}: {attribute!r} is a {type(target).__name__}, expected "
            "a factory (a class or function making the map) or an Implementation"
        )
    return implementation(target, getattr(target, "cowstate_capabilities", None), name=name)


# ------------------------------------------------------------------ helpers


def _implementation_of(
    target: Implementation | Callable[..., Any],
    capabilities: Capabilities | None,
    options: dict[str, Any],
) -> Implementation:
    if isinstance(target, Implementation):
        if capabilities is not None:
            return dataclasses.replace(target, capabilities=capabilities)
        return target
    return implementation(target, capabilities, **options)


def _with_capacity(factory: Callable[..., Any]) -> Callable[..., Any]:
    """``factory``, taking and passing ``initial_capacity`` only where it has one."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        return factory
    takes = "initial_capacity" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
    if takes:
        return factory

    def make(initial_capacity: int | None = None) -> Any:
        return factory()

    return make


def _name_of(factory: Any) -> str:
    module = getattr(factory, "__module__", None) or "?"
    return f"{module}:{getattr(factory, '__qualname__', repr(factory))}"


def _keep(instance: object) -> None:
    """Nothing to free."""


def _failure_message(
    target: Implementation,
    spec: WorkloadSpec,
    index: int,
    minimal: Sequence[tuple[Any, ...]],
    replay: WorkloadResult,
) -> str:
    calls = "\n".join(f"    {encode(op)!r}," for op in minimal)
    return (
        f"{target.name} disagrees with the model in workload {index} of spec {spec.name!r}; "
        f"minimized to {len(minimal)} operations (replay: run_workload(implementation, "
        f"[decode(op) for op in OPERATIONS], check_every=1, "
        f"initial_capacity={spec.initial_capacity})):\n"
        f"OPERATIONS = [\n{calls}\n]\n"
        f"expected {replay.expected}\n"
        f"got      {replay.actual}"
    )
