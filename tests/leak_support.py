"""The leak measurement the maps' leak tests share (tests/test_implementations.py,
tests/test_user_code_errors.py): a cycle run once to warm caches, once under
``tracemalloc``, then ``cycles`` times more; what the traced memory grew by.
The caller also compares the reference counts of the objects the cycle touched.

Under ``make sanitize`` a leak test runs :func:`cycles` of its count (a
tenth): see there.

``MAP_OPERATIONS`` is every public operation of a map as a step on a loaded
map, and ``operation_leaks`` runs one in such cycles over the keys,
namespaces and states of :class:`Objects`: the reference counts that moved
and the memory left behind.
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from cowstate.errors import CowStateError


def cycles(count: int) -> int:
    """The cycles a leak test runs: ``count``, or under ``make sanitize``
    (``scripts/sanitize.sh`` sets ``COWSTATE_SANITIZED=1``) a tenth of it, at
    least 3. There the cycles are for AddressSanitizer, UBSan and
    LeakSanitizer, which report a bad access or a block of the C code's own
    never freed in the first cycle that makes it -- every cycle runs the same
    operations, and a few cycles reach what only a second one does (free
    lists, caches filled) -- while the counts the test compares (reference
    counts, traced and malloc'd memory) are the plain suite's: it runs the same
    C code with every cycle, and traces the C code's own blocks too, which the
    sanitized build takes straight from malloc (``scripts/sanitize.sh``). A
    reference leaked per cycle still moves a count after three."""
    if os.environ.get("COWSTATE_SANITIZED") == "1":
        return max(3, count // 10)
    return count


def traced_growth(cycle: Callable[[], None], cycles: int) -> int:
    """Bytes of traced memory ``cycles`` runs of ``cycle`` leave behind."""
    cycle()
    gc.collect()
    tracemalloc.start()
    try:
        cycle()
        gc.collect()
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(cycles):
            cycle()
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return end - start


# ------------------------------------------- every public operation of a map


class Named:
    """A key or namespace whose references a leak test counts: equal by name,
    so a lookup with an equal copy runs ``__eq__`` as a user's key would."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Named) and self.name == other.name

    def __repr__(self) -> str:
        return f"Named({self.name!r})"


class Objects:
    """What a cycle puts into a map: keys (and equal copies the lookups use),
    two namespaces, states and their replacements. ``refcounts()`` is the
    baseline a leak test compares with."""

    def __init__(self, count: int = 12) -> None:
        self.keys = [Named(f"k{i}") for i in range(count)]
        self.probes = [Named(f"k{i}") for i in range(count)]  # equal, not identical
        self.namespaces = [Named("n0"), Named("n1")]
        self.states = [[i] for i in range(count)]
        self.replacements = [[100 + i] for i in range(count)]

    def every(self) -> list[Any]:
        return [*self.keys, *self.probes, *self.namespaces, *self.states, *self.replacements]

    def refcounts(self) -> dict[str, int]:
        # Keys and probes are equal and print alike: labelled, or a probe's
        # count would stand for its key's (a key's leak went unseen).
        groups: list[tuple[str, list[Any]]] = [("key ", self.keys), ("probe ", self.probes)]
        groups += [("", self.namespaces), ("", self.states), ("", self.replacements)]
        return {label + repr(o): sys.getrefcount(o) for label, group in groups for o in group}

    def pairs(self) -> list[tuple[Named, Named]]:
        """``(probe, namespace)`` of every mapping a loaded map holds."""
        return [(p, self.namespaces[i % 2]) for i, p in enumerate(self.probes)]


def _load(m: Any, o: Objects) -> None:
    for i, key in enumerate(o.keys):
        m.put(key, o.namespaces[i % 2], o.states[i])


def _put_replace(m: Any, o: Objects) -> None:
    for i, (key, ns) in enumerate(o.pairs()):
        m.put(key, ns, o.replacements[i])


def _get(m: Any, o: Objects) -> None:
    for key, ns in o.pairs():
        m.get(key, ns)


def _get_while_a_snapshot_is_open(m: Any, o: Objects) -> None:
    snapshot = m.snapshot()
    _get(m, o)  # rule S copies, rule E copies
    snapshot.release()


def _put_and_get_old(m: Any, o: Objects) -> None:
    snapshot = m.snapshot()
    for i, (key, ns) in enumerate(o.pairs()):
        m.put_and_get_old(key, ns, o.replacements[i])  # shared: copied first
        m.put_and_get_old(key, ns, o.states[i])  # private: handed over
    snapshot.release()


def _remove(m: Any, o: Objects) -> None:
    for key, ns in o.pairs()[::2]:
        m.remove(key, ns)
    snapshot = m.snapshot()
    for key, ns in o.pairs()[1::2]:
        m.remove(key, ns)  # rule E on shared predecessors
    snapshot.release()


def _remove_and_get_old(m: Any, o: Objects) -> None:
    for key, ns in o.pairs()[::2]:
        m.remove_and_get_old(key, ns)
    snapshot = m.snapshot()
    for key, ns in o.pairs()[1::2]:
        m.remove_and_get_old(key, ns)  # shared: copied before unmapping
    snapshot.release()


def _transform(m: Any, o: Objects) -> None:
    snapshot = m.snapshot()
    for key, ns in o.pairs():
        m.transform(key, ns, 1, lambda old, value: [*old, value])
    m.transform(Named("absent"), o.namespaces[0], 1, lambda old, value: [value])
    snapshot.release()


def _failing_transform(m: Any, o: Objects) -> None:
    def raising(old: Any, value: int) -> Any:
        raise ValueError(f"refuses {old!r}")

    for i, (key, ns) in enumerate(o.pairs()):
        snapshot = m.snapshot() if i % 2 else None
        with pytest.raises(CowStateError):
            m.transform(key, ns, 1, raising)
        with pytest.raises(CowStateError):
            m.transform(key, ns, 1, lambda old, value: None)
        if snapshot is not None:
            snapshot.release()


def _contains(m: Any, o: Objects) -> None:
    for key, ns in o.pairs():
        assert m.contains_key(key, ns) and (key, ns) in m
    assert not m.contains_key(Named("absent"), o.namespaces[0])


def _keys_and_size_of_namespace(m: Any, o: Objects) -> None:
    for ns in o.namespaces:
        assert len(list(m.keys(ns))) == m.size_of_namespace(ns) == len(o.keys) // 2


def _iterate(m: Any, o: Objects) -> None:
    assert len(list(m)) == len(m)
    iterator = iter(m)
    next(iterator)
    del iterator  # dropped half-way


def _snapshot_read_and_release(m: Any, o: Objects) -> None:
    snapshot = m.snapshot()
    _put_replace(m, o)
    assert len(list(snapshot)) == len(snapshot) == len(snapshot.items())
    iterator = iter(snapshot)
    next(iterator)
    del iterator
    m.release(snapshot)


def _release_out_of_order(m: Any, o: Objects) -> None:
    snapshots = []
    for i, (key, ns) in enumerate(o.pairs()[:3]):
        snapshots.append(m.snapshot())
        m.put(key, ns, o.replacements[i])
        m.get(key, ns)
    for i in (1, 0, 2):
        snapshots[i].release()


def _hand_back_and_reclaim(m: Any, o: Objects) -> None:
    # Rule G: a hand_back leaves the replaced states to the owner; a write
    # frees a few, reclaim() the rest of one snapshot, and the map's
    # deallocation the rest of another.
    first = m.snapshot()
    _put_replace(m, o)
    first.hand_back()
    key, ns = o.pairs()[0]
    m.put(key, ns, o.replacements[0])
    m.reclaim()
    second = m.snapshot()
    _put_replace(m, o)
    second.hand_back()


def _drop_without_release(m: Any, o: Objects) -> None:
    snapshot = m.snapshot()
    _put_replace(m, o)
    _remove(m, o)
    del snapshot  # released by its deallocation


def _track_changes(m: Any, o: Objects) -> None:
    # Rules T and D: a get marks, the removal log overflows (its records are
    # dropped), is read, trimmed, and dropped with the map still holding some.
    m.track_changes(4)
    base = m.snapshot()
    base.release()
    _get(m, o)  # marked: no copy
    for key, ns in o.pairs()[:6]:
        m.remove(key, ns)  # six records past a limit of four: an overflow
    later = m.snapshot()
    for key, ns in o.pairs()[6:8]:
        m.remove_and_get_old(key, ns)
    assert m.removals_since(later.version) is not None
    assert m.removals_since(base.version) is None  # the overflow forgot it
    assert len(later.changed_items(base.version)) == len(later)
    m.trim_removals(later.version)
    m.track_changes(2)  # smaller than the log: dropped, as an overflow
    m.remove(*o.pairs()[9])
    later.release()


#: Every public operation of a map, each as a step on a loaded map (capacity 4:
#: in a rehash). Loading is ``put`` of new mappings.
MAP_OPERATIONS: dict[str, Callable[[Any, Objects], None]] = {
    "put new": lambda m, o: None,
    "put replace": _put_replace,
    "get": _get,
    "get while a snapshot is open": _get_while_a_snapshot_is_open,
    "put_and_get_old": _put_and_get_old,
    "remove": _remove,
    "remove_and_get_old": _remove_and_get_old,
    "transform": _transform,
    "transform raising or returning None": _failing_transform,
    "contains_key and in": _contains,
    "keys and size_of_namespace": _keys_and_size_of_namespace,
    "iterate": _iterate,
    "snapshot, read and release": _snapshot_read_and_release,
    "release out of order": _release_out_of_order,
    "hand back, reclaim, drop with garbage": _hand_back_and_reclaim,
    "drop a snapshot without release": _drop_without_release,
    "track changes: log, overflow, read, trim, drop": _track_changes,
}


def operation_leaks(
    map_class: type[Any], operation: str, cycles: int
) -> tuple[dict[str, int], int]:
    """``cycles`` runs of: a map of ``map_class`` loaded, ``operation`` on it, the
    map dropped. The objects whose reference counts moved (name: by how much)
    and the bytes of traced memory the runs left behind."""
    o = Objects()
    step = MAP_OPERATIONS[operation]

    def cycle() -> None:
        m = map_class(initial_capacity=4)
        _load(m, o)
        step(m, o)

    baseline = o.refcounts()
    growth = traced_growth(cycle, cycles)
    after = o.refcounts()
    moved = {name: after[name] - count for name, count in baseline.items() if after[name] != count}
    return moved, growth
