"""The process protocol's loop for a Python map (the child's side of ``docs/protocol.md``).

:func:`serve` reads request lines from standard input and answers each with
one line on standard output until standard input closes. It is what a
Python map needs to be checked through the protocol, and what the reference
adapter (:mod:`cowstate_spec.adapters.cmap`) runs; an adapter in another
language does the same things, as the page says.

How it keeps the protocol's promises:

1. **Results are taken when the operation returns.** A state in a result is
   copied at once (``deep_copy``: flat lists and dicts cheaply), since a
   later operation of the same batch may mutate the very object.
2. **Handles are ``id(state)``.** The runner compares two handles only while
   the map or a snapshot holds the objects (that is where rule S matters),
   so an address is never reused under it.
3. **Refusals and crashes.** An exception of ``refusals`` (the map's own
   refusal of bad input, a failing transform function) is a ``refused``
   result and the batch goes on; any other exception is a ``crashed`` result
   with its traceback, and the batch ends there.
"""

from __future__ import annotations

import itertools
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import IO, Any

from cowstate.errors import ConcurrentModificationError, CowStateError
from cowstate_model import deep_copy
from cowstate_spec.contract import TRANSFORMS, mutate_in_place
from cowstate_spec.protocol import (
    CAPABILITY_DEFAULTS,
    VERSION,
    key_from_wire,
    key_to_wire,
    state_to_wire,
)

__all__ = ["serve"]


class _Crash(Exception):
    """An operation raised something that is no refusal: the batch ends."""


def serve(
    factory: Callable[..., Any],
    *,
    name: str,
    capabilities: dict[str, bool] | None = None,
    refusals: tuple[type[BaseException], ...] = (CowStateError,),
    concurrent_modification: type[BaseException] = ConcurrentModificationError,
    rehash: Callable[[Any], tuple[int, int] | None] | None = None,
    check: Callable[[Any, list[Any]], None] | None = None,
    fingerprint: Callable[..., Any] | None = None,
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
) -> int:
    """Serve the protocol for maps ``factory(initial_capacity=N)`` makes until
    standard input closes; return the exit status (0).

    ``capabilities`` are the hello's (defaults: :data:`CAPABILITY_DEFAULTS`);
    ``rehash(map)`` says how far a rehash is (``(index, capacity)``, ``None``
    outside one) where ``rehash_visible``; ``check(map, fingerprints)`` is the
    structural checker and ``fingerprint(snapshot, values=False)`` what it is
    given of each open snapshot where ``check``.
    """
    session = _Session(factory, refusals, concurrent_modification, rehash, check, fingerprint)
    announced = {**CAPABILITY_DEFAULTS, **(capabilities or {})}
    source = stdin or sys.stdin
    sink = stdout or sys.stdout
    for line in source:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            number = request["id"]
        except (ValueError, KeyError, TypeError) as exc:
            _answer(sink, {"id": None, "error": f"expected a JSON request with an id: {exc}"})
            continue
        if "hello" in request:
            offered = request["hello"].get("protocol", [])
            if VERSION not in offered:
                _answer(
                    sink, {"id": number, "error": f"expected protocol {VERSION}, got {offered}"}
                )
                continue
            _answer(
                sink,
                {
                    "id": number,
                    "hello": {
                        "protocol": VERSION,
                        "implementation": name,
                        "capabilities": announced,
                    },
                },
            )
            continue
        try:
            results, sizes = session.batch(request["ops"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            _answer(sink, {"id": number, "error": f"malformed request: {exc!r}"})
            continue
        _answer(sink, {"id": number, "results": results, "sizes": sizes})
    return 0


def _answer(sink: IO[str], message: dict[str, Any]) -> None:
    sink.write(json.dumps(message, separators=(",", ":")) + "\n")
    sink.flush()


def _key(value: Any) -> Any:
    return key_from_wire(value) if type(value) is dict else value


def _state(state: Any) -> Any:
    """A state for a result: a copy taken now (rule 1), tuples tagged."""
    kind = type(state)
    if kind is int or kind is str:
        return state
    if kind is tuple:
        return state_to_wire(state)
    return deep_copy(state)


def _held(state: Any) -> list[Any]:
    """``[handle, state]`` of a state handed out."""
    return [id(state), _state(state)]


class _Session:
    """The map of the last ``create``, its open snapshots, and the operations."""

    def __init__(
        self,
        factory: Callable[..., Any],
        refusals: tuple[type[BaseException], ...],
        concurrent_modification: type[BaseException],
        rehash: Callable[[Any], tuple[int, int] | None] | None,
        check: Callable[[Any, list[Any]], None] | None,
        fingerprint: Callable[..., Any] | None,
    ) -> None:
        self.factory = factory
        self.refusals = refusals
        self.concurrent_modification = concurrent_modification
        self.rehash = rehash
        self.checker = check
        self.fingerprint = fingerprint
        self.map: Any = None
        self.open: dict[Any, tuple[Any, Any]] = {}  # id -> (snapshot, fingerprint)
        self.operations: dict[str, Callable[..., Any]] = {
            name: getattr(self, name)
            for name in (
                "create",
                "put",
                "get",
                "get_and_mutate",
                "contains_key",
                "put_and_get_old",
                "remove",
                "remove_and_get_old",
                "transform",
                "snapshot",
                "release",
                "snapshots",
                "iterate",
                "keys",
                "interrupt_iteration",
                "check",
            )
        }

    def batch(self, ops: list[list[Any]]) -> tuple[list[Any], list[int]]:
        results: list[Any] = []
        sizes: list[int] = []
        for op in ops:
            try:
                results.append(self.apply(op))
            except _Crash as crash:
                results.append({"error": "crashed", "message": str(crash)})
                sizes.append(-1 if self.map is None else len(self.map))
                break
            sizes.append(-1 if self.map is None else len(self.map))
        return results, sizes

    def apply(self, op: list[Any]) -> Any:
        try:
            operation = self.operations[op[0]]
        except KeyError:
            raise ValueError(f"unknown operation {op[0]!r}") from None
        try:
            return operation(*op[1:])
        except self.refusals as exc:
            return {"error": "refused", "message": f"{type(exc).__name__}: {exc}"}
        except Exception:
            raise _Crash(traceback.format_exc()) from None

    # ------------------------------------------------------------ operations

    def create(self, initial_capacity: int | None) -> None:
        for snapshot, _ in self.open.values():
            snapshot.release()
        self.open = {}
        self.map = (
            self.factory()
            if initial_capacity is None
            else self.factory(initial_capacity=initial_capacity)
        )

    def put(self, key: Any, namespace: Any, state: Any) -> list[Any]:
        inserted = self.map.put(_key(key), _key(namespace), state)
        return [inserted, id(state)]

    def get(self, key: Any, namespace: Any) -> Any:
        state = self.map.get(_key(key), _key(namespace))
        return None if state is None else _held(state)

    def get_and_mutate(self, key: Any, namespace: Any, item: int) -> Any:
        state = self.map.get(_key(key), _key(namespace))
        if state is None:
            return None
        mutate_in_place(state, item)
        return _held(state)

    def contains_key(self, key: Any, namespace: Any) -> bool:
        return bool(self.map.contains_key(_key(key), _key(namespace)))

    def put_and_get_old(self, key: Any, namespace: Any, state: Any, item: int) -> list[Any]:
        old = self.map.put_and_get_old(_key(key), _key(namespace), state)
        if old is not None:
            mutate_in_place(old, item)
        return [None if old is None else _held(old), id(state)]

    def remove(self, key: Any, namespace: Any) -> None:
        self.map.remove(_key(key), _key(namespace))

    def remove_and_get_old(self, key: Any, namespace: Any, item: int) -> Any:
        old = self.map.remove_and_get_old(_key(key), _key(namespace))
        if old is None:
            return None
        mutate_in_place(old, item)
        return _held(old)

    def transform(self, key: Any, namespace: Any, value: Any, function: str) -> list[Any]:
        base = TRANSFORMS[function]
        seen: list[Any] = [None, None]

        def fn(old: Any, value: Any) -> Any:
            seen[0] = old
            seen[1] = base(old, value)
            return seen[1]

        self.map.transform(_key(key), _key(namespace), value, fn)
        return [None if seen[0] is None else id(seen[0]), id(seen[1])]

    def snapshot(self, number: Any) -> Any:
        progress = self.rehash(self.map) if self.rehash is not None else None
        snapshot = self.map.snapshot()
        fp = self.fingerprint(snapshot, values=False) if self.checker and self.fingerprint else None
        self.open[number] = (snapshot, fp)
        if self.rehash is None:
            return None
        return False if progress is None else list(progress)

    def release(self, number: Any) -> list[list[Any]]:
        snapshot, _ = self.open.pop(number)
        entries = self._entries(snapshot)
        snapshot.release()
        return entries

    def snapshots(self) -> list[list[Any]]:
        return [[number, self._entries(snapshot)] for number, (snapshot, _) in self.open.items()]

    def iterate(self) -> list[list[Any]]:
        return self._entries(self.map)

    def keys(self, namespace: Any) -> list[Any]:
        return [key_to_wire(key) for key in self.map.keys(_key(namespace))]

    def interrupt_iteration(self, taken: int, op: list[Any]) -> list[Any]:
        rehashing = None if self.rehash is None else self.rehash(self.map) is not None
        iterator = iter(self.map)
        seen = self._entries(itertools.islice(iterator, taken % (len(self.map) + 1)))
        result = self.apply(op)
        step: Any
        rest: list[Any] = []
        try:
            step = self._entry(next(iterator))
        except StopIteration:
            step = "end"
        except self.concurrent_modification:
            step = "failed"
        else:
            try:
                rest.extend(self._entries(iterator))
            except self.concurrent_modification:
                rest.append("failed")
        return [seen, result, rehashing, step, rest]

    def check(self) -> Any:
        if self.checker is None:
            return None
        try:
            self.checker(self.map, [fp for _, fp in self.open.values() if fp is not None])
        except AssertionError as exc:
            return {"error": "invariant", "message": str(exc)}
        return None

    # --------------------------------------------------------------- helpers

    def _entry(self, entry: Any) -> list[Any]:
        key, namespace, state = entry
        return [key_to_wire(key), key_to_wire(namespace), _state(state)]

    def _entries(self, entries: Iterator[Any] | Any) -> list[list[Any]]:
        return [self._entry(entry) for entry in entries]
