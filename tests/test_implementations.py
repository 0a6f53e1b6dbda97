"""The two maps: which one you get, and what the C map adds.

The shared contract of both maps is in the state machines and scenario tests
(parametrized over both, see tests/conftest.py); this module holds what is
particular to having two: the C map is built and chosen unless forced off,
its entries are invisible to the garbage collector yet cycles through them
are collected, nothing leaks, snapshots share chunks instead of copying
them, and every structural invariant of the C map has a corruption the
checker names.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import os
import random
import subprocess
import sys
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from conftest import MAPS
from leak_support import MAP_OPERATIONS, Objects, cycles, operation_leaks, traced_growth

import cowstate
from cowstate import maps, state_map
from cowstate._cmap import CHUNK_BUCKETS
from cowstate._cmap import CopyOnWriteStateMap as CMap
from cowstate.introspection import describe
from cowstate_spec import cmap_view
from cowstate_spec.bad_cmaps import C_BUGS, LEAK_PROBE, build_bad_cmap
from cowstate_spec.cmap_view import MapView, view_of
from cowstate_spec.invariants import InvariantViolation, chain, check_map, fingerprint
from cowstate_spec.keys import HashKey

C_MAP = maps.c_map_class()
needs_c = pytest.mark.skipif(
    C_MAP is None,
    reason="the C map is not built: test_the_c_map_is_built_and_chosen fails for that",
)


def c_map(initial_capacity: int | None = None) -> CMap[Any, Any, Any]:
    """A C map (for the tests marked ``needs_c``), of the default capacity unless given."""
    assert C_MAP is not None
    return C_MAP() if initial_capacity is None else C_MAP(initial_capacity=initial_capacity)


def test_the_c_map_is_built_and_chosen_unless_pure_python_is_forced() -> None:
    # CI runs without COWSTATE_PURE_PYTHON: a missing or broken build fails here.
    if maps.FORCED_PURE:
        assert cowstate.IMPLEMENTATION == "python"
        assert cowstate.CopyOnWriteStateMap is state_map.CopyOnWriteStateMap
        return
    assert maps.C_BUILD_ERROR is None, f"the C map did not build: {maps.C_BUILD_ERROR}"
    assert cmap_view.PROBE_ERROR is None, f"its probe did not build: {cmap_view.PROBE_ERROR}"
    assert cowstate.IMPLEMENTATION == "c"
    # As objects: to mypy, cowstate.CopyOnWriteStateMap is the pure map's class.
    chosen: object = cowstate.CopyOnWriteStateMap
    tables_map: object = cowstate.CopyOnWriteStateTable.map_class
    assert chosen is C_MAP
    assert tables_map is C_MAP  # the tables use it too


def test_cowstate_pure_python_forces_the_pure_map_in_a_fresh_process() -> None:
    code = (
        "import cowstate; print(cowstate.IMPLEMENTATION, "
        "cowstate.CopyOnWriteStateMap.__module__, cowstate.StateMapSnapshot.__module__)"
    )
    env = {**os.environ, "COWSTATE_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["python", "cowstate.state_map", "cowstate.state_map"]
    assert state_map.CopyOnWriteStateMap.__module__ == "cowstate.state_map"


@pytest.mark.parametrize("impl", list(MAPS))
def test_a_state_referring_back_to_its_map_is_collected(impl: str) -> None:
    class Holder:
        owner: Any = None

    m = MAPS[impl]()
    holder = Holder()
    holder.owner = m
    m.put(HashKey("k", 1), "ns", holder)
    m.put("other", holder, [holder])  # through the namespace and a list too
    ref = weakref.ref(m)
    del m, holder
    gc.collect()
    assert ref() is None


def tracked_entries() -> int:
    """The pure map's entries the collector tracks right now."""
    return sum(type(o) is state_map._Entry for o in gc.get_objects())


@needs_c
def test_c_entries_are_not_garbage_collected_objects() -> None:
    # The collector is off while counting: a collection in between freed
    # other tests' garbage and made the count of tracked objects fall (the
    # pure map's 10,000 entries once counted 9,935).
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        m = c_map()
        for i in range(10_000):
            m.put(i, "ns", i)
        grown = len(gc.get_objects()) - before
        assert grown <= 3, f"{grown} new GC-tracked objects for 10,000 C entries"
        pure: state_map.CopyOnWriteStateMap[int, str, int] = state_map.CopyOnWriteStateMap()
        entries = tracked_entries()
        for i in range(10_000):
            pure.put(i, "ns", i)
        assert tracked_entries() - entries == 10_000  # each _Entry is one
    finally:
        gc.enable()


@needs_c
def test_build_snapshot_mutate_release_drop_leaks_nothing() -> None:
    states = [[i] for i in range(64)]
    baseline = [sys.getrefcount(s) for s in states]

    def cycle() -> None:
        m = c_map(initial_capacity=4)
        for i, s in enumerate(states):
            m.put(i, i % 3, s)
        first = m.snapshot()
        for i in range(0, 64, 2):
            m.get(i, i % 3)  # rule S copies
            m.remove(i + 1, (i + 1) % 3)  # rule E copies
        for i in range(64, 300):  # a rehash while snapshots are open
            m.put(i, 0, [i])
        second = m.snapshot()
        m.transform(3, 0, 1, lambda old, v: [v])
        first.release()
        list(second)
        second.release()
        open_and_dropped = m.snapshot()  # released by its deallocation
        del open_and_dropped

    count = cycles(200)
    growth = traced_growth(cycle, count)
    assert [sys.getrefcount(s) for s in states] == baseline
    assert growth < 64 * 1024, f"memory grew by {growth} bytes over {count} cycles"


@pytest.mark.parametrize("operation", list(MAP_OPERATIONS))
@pytest.mark.parametrize("impl", list(MAPS))
def test_every_operation_returns_every_reference_and_leaves_memory_flat(
    impl: str, operation: str
) -> None:
    # Issue 26: a state put replaced and never released passed the suite; the
    # cycle above missed it. Keys, equal probes, namespaces, states: each back
    # to its count; the traced memory flat over 200 cycles (make sanitize: 20).
    count = cycles(200)
    moved, growth = operation_leaks(MAPS[impl], operation, count)
    assert moved == {}, f"{operation}: reference counts moved {moved}"
    assert growth < 64 * 1024, f"{operation}: memory grew by {growth} bytes over {count} cycles"


@needs_c
def test_the_leak_test_catches_a_put_that_keeps_the_state_it_replaced() -> None:
    # The planted c-put-leaks-replaced-state: every state a put replaces keeps
    # one reference per cycle (the measurement runs 2 + cycles), nothing else.
    bug = next(b for b in C_BUGS if b.name == "c-put-leaks-replaced-state")
    leaky = build_bad_cmap(bug).CopyOnWriteStateMap
    moved, _ = operation_leaks(leaky, "put replace", 10)
    assert moved == {repr(state): 12 for state in Objects().states}


@needs_c
def test_the_leak_test_catches_an_entry_that_is_never_freed() -> None:
    # LEAK_PROBE: no reference leaks, only memory (the probe of make
    # sanitize's LeakSanitizer self-check): 12 entries of 48 bytes per cycle.
    leaky = build_bad_cmap(LEAK_PROBE).CopyOnWriteStateMap
    moved, growth = operation_leaks(leaky, "remove", 200)
    assert moved == {}
    assert growth >= 200 * 12 * 48, f"memory grew by {growth} bytes only"


@needs_c
def test_interpreter_shutdown_with_open_snapshots_is_clean() -> None:
    code = """
import cowstate
m = cowstate.CopyOnWriteStateMap(initial_capacity=4)
for i in range(500):
    m.put(i, "ns", [i])
m.put("self", "ns", [m])
snaps = [m.snapshot() for _ in range(3)]
m.get(1, "ns").append(1)
it = iter(snaps[1])
next(it)
class Cycle:
    pass
c = Cycle(); c.snap = m.snapshot(); c.m = m; m.put("c", "ns", c)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


@needs_c
def test_release_on_a_writer_thread_while_the_owner_mutates() -> None:
    m = c_map(initial_capacity=4)
    expected: dict[tuple[int, int], list[int]] = {}
    pending: list[Any] = []
    lock = threading.Lock()
    stop = threading.Event()
    contents_ok: list[bool] = []

    def writer() -> None:
        while not stop.is_set() or pending:
            with lock:
                job = pending.pop(0) if pending else None
            if job is None:
                continue
            snap, frozen = job
            contents_ok.append({(k, n): s for k, n, s in snap} == frozen)
            snap.release()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for step in range(3000):
            key = (step * 7919 % 257, step % 3)
            if step % 5 == 4:
                m.remove(*key)
                expected.pop(key, None)
            else:
                state = m.get(*key)
                if state is None:
                    m.put(*key, [step])
                    expected[key] = [step]
                else:
                    state.append(step)  # allowed: get hands out a private copy
                    expected[key] = state
            if step % 50 == 0:
                frozen = {k: list(v) for k, v in expected.items()}
                with lock:
                    pending.append((m.snapshot(), frozen))
    finally:
        stop.set()
        thread.join(60)
        sys.setswitchinterval(old)
    assert contents_ok and all(contents_ok)
    assert {(k, n): s for k, n, s in m} == expected
    assert not m._open_versions
    check_map(m)


# ------------------------------------------------ rule G: handed-back entries


class Weak(list[int]):
    """A state a test can watch die (a list subclass takes a weak reference)."""


def _replaced_under_hand_back(m: Any, n: int) -> list[weakref.ref[Weak]]:
    """``n`` mappings put, a snapshot, every state replaced, the snapshot handed
    back: weak references to the replaced states."""
    olds = [Weak([i]) for i in range(n)]
    for i, state in enumerate(olds):
        m.put(i, "ns", state)
    snapshot = m.snapshot()
    for i in range(n):
        m.put(i, "ns", Weak([-i]))
    refs = [weakref.ref(state) for state in olds]
    del olds
    snapshot.hand_back()
    return refs


@needs_c
def test_a_handed_back_snapshot_leaves_its_entries_to_the_owners_writes() -> None:
    m = c_map(initial_capacity=4)
    refs = _replaced_under_hand_back(m, 40)
    assert m.pending_reclaim == 40
    assert all(ref() is not None for ref in refs)  # nothing freed by the hand-back
    check_map(m)
    m.put(0, "ns", Weak([0]))  # a write frees 4 (GARBAGE_STEP), oldest first
    assert m.pending_reclaim == 36
    assert sum(ref() is None for ref in refs) == 4
    m.get(1, "ns")
    m.contains_key(1, "ns")  # reads free nothing
    assert m.pending_reclaim == 36
    writes: list[Callable[[], object]] = [
        lambda: m.put_and_get_old(1, "ns", Weak([1])),
        lambda: m.remove(2, "ns"),
        lambda: m.remove_and_get_old(3, "ns"),
        lambda: m.transform(4, "ns", 5, lambda old, v: Weak([v])),
    ]
    for write in writes:
        before = m.pending_reclaim
        write()
        assert m.pending_reclaim == before - 4
    check_map(m)
    while m.pending_reclaim:
        m.put(5, "ns", Weak([5]))
    assert all(ref() is None for ref in refs)
    check_map(m)


@pytest.mark.parametrize("impl", list(MAPS))
def test_reclaim_frees_every_handed_back_entry_and_counts_them(impl: str) -> None:
    m = MAPS[impl](initial_capacity=4)
    refs = _replaced_under_hand_back(m, 30)
    expected = 30 if impl == "c" else 0  # the pure map frees at the hand-back
    assert m.pending_reclaim == expected
    assert m.reclaim() == expected
    assert m.pending_reclaim == 0
    assert m.reclaim() == 0
    assert all(ref() is None for ref in refs)
    assert {(k, n): s for k, n, s in m} == {(i, "ns"): [-i] for i in range(30)}


@needs_c
def test_a_map_dropped_with_handed_back_entries_frees_them() -> None:
    m = c_map(initial_capacity=4)
    refs = _replaced_under_hand_back(m, 25)
    assert m.pending_reclaim == 25
    del m
    assert all(ref() is None for ref in refs)


@needs_c
def test_a_finalizer_writing_to_the_map_during_a_reclaim_frees_every_entry_once() -> None:
    m = c_map(initial_capacity=4)
    finalized: list[int] = []

    class Writes(list[int]):
        def __del__(self) -> None:
            finalized.append(self[0])
            m.put(1000 + self[0], "ns", [self[0]])  # re-enters the map's reclaim

    for i in range(12):
        m.put(i, "ns", Writes([i]))
    snapshot = m.snapshot()
    for i in range(12):
        m.put(i, "ns", [-i])
    snapshot.hand_back()
    assert finalized == []
    m.put(99, "ns", [99])  # frees 4; each finalizer's put frees 4 more
    assert m.pending_reclaim == 0
    assert sorted(finalized) == list(range(12))
    assert {k for k, _, _ in m} == {*range(12), 99, *range(1000, 1012)}
    check_map(m)


def test_a_table_hands_its_key_groups_back_and_the_backend_reclaims_them() -> None:
    backend = cowstate.HeapKeyedStateBackend(cowstate.KeyGroupRange(0, 7), 8)
    state = backend.get_state(cowstate.ValueStateDescriptor("v"))
    for key in range(200):
        backend.set_current_key(key)
        state.update([key])
    updated = threading.Event()

    def stream_after_the_updates() -> io.BytesIO:
        updated.wait()  # every key group stays held while the owner writes
        return io.BytesIO()

    future = backend.snapshot(1, stream_after_the_updates)
    for key in range(200):
        backend.set_current_key(key)
        state.update([key, key])
    updated.set()
    result = future.result()
    assert result.info is not None and result.info.entries == 200
    expected = 200 if maps.IMPLEMENTATION == "c" else 0  # one replaced entry per key
    assert backend.pending_reclaim == expected
    assert backend.reclaim() == expected
    assert backend.pending_reclaim == 0
    backend.close()


@needs_c
def test_a_snapshot_shares_chunks_and_the_first_write_copies_one() -> None:
    m = c_map(initial_capacity=4 * CHUNK_BUCKETS)
    for i in range(3 * CHUNK_BUCKETS):  # the threshold (3/4 of the capacity): no rehash
        m.put(i, "ns", i)
    before = MapView(m).primary_directory
    assert before[2] == CHUNK_BUCKETS and len(before[3]) == 4  # 4 chunks
    snap = m.snapshot()
    shared = MapView(m).primary_directory[3]
    assert all(refs == 2 for address, refs in shared if address)  # live + snapshot
    m.put(0, "ns", -1)  # rule C: one chunk copied
    after = MapView(m).primary_directory[3]
    changed = [i for i, (a, b) in enumerate(zip(shared, after, strict=True)) if a[0] != b[0]]
    assert len(changed) == 1 and after[changed[0]][1] == 1
    assert dict(((k, n), s) for k, n, s in snap)[(0, "ns")] == 0
    snap.release()
    assert all(refs == 1 for address, refs in MapView(m).primary_directory[3] if address)


def spare_addresses(m: Any) -> list[int]:
    """The map's spare chunks (rule P of ``_cmap.c``), as the probe walks them."""
    return [address for address, _refs in MapView(m).spares]


def chunks_of(m: Any) -> list[int]:
    return [address for address, _refs in MapView(m).primary_directory[3]]


def map_of_four_chunks() -> Any:
    m = c_map(initial_capacity=4 * CHUNK_BUCKETS)
    for i in range(3 * CHUNK_BUCKETS):  # the threshold: no rehash
        m.put(i, "ns", i)
    return m


def write_every_chunk(m: Any, value: int) -> None:
    """Writes to 300 keys: each of the four chunks gets some (rule C copies each
    once while a snapshot holds it; checked by the callers)."""
    for i in range(300):
        m.put(i, "ns", value)


@needs_c
def test_a_release_keeps_the_chunks_it_frees_as_spares_that_the_next_copies_take() -> None:
    m = map_of_four_chunks()
    snap = m.snapshot()
    shared = chunks_of(m)
    write_every_chunk(m, -1)
    assert not set(chunks_of(m)) & set(shared) and spare_addresses(m) == []
    snap.release()  # the four chunks only the snapshot held now
    spares = spare_addresses(m)
    assert sorted(spares) == sorted(shared)
    check_map(m)
    snap = m.snapshot()
    recorded = fingerprint(snap)
    write_every_chunk(m, -2)  # the copies take the spares: no allocation
    assert sorted(chunks_of(m)) == sorted(shared) and spare_addresses(m) == []
    check_map(m, [recorded])
    snap.release()


@needs_c
def test_a_map_keeps_no_more_spares_than_its_directories_have_slots() -> None:
    """The memory bound of rule P: one spare per directory slot of the live
    tables, however many snapshots free their chunks at once (three snapshots
    hold a copy of all four chunks each here)."""
    m = map_of_four_chunks()
    snapshots = []
    for round_ in range(3):
        snapshots.append(m.snapshot())
        write_every_chunk(m, round_)
    for snap in snapshots:
        snap.release()
    assert len(spare_addresses(m)) == 4  # 12 chunks freed, 4 slots
    check_map(m)


@needs_c
def test_a_rehash_to_another_chunk_size_frees_the_spares_of_the_old_size() -> None:
    m = c_map(initial_capacity=64)  # one chunk of 64 buckets
    for i in range(40):
        m.put(i, "ns", i)
    snap = m.snapshot()
    m.put(0, "ns", -1)
    snap.release()
    assert len(spare_addresses(m)) == 1
    for i in range(40, 60):  # past the threshold: a table of one chunk of 128 buckets
        m.put(i, "ns", i)
    while MapView(m).rehash_directory is not None:
        m.get(0, "ns")
    assert MapView(m).primary_directory[2] == 128 and spare_addresses(m) == []
    snap = m.snapshot()
    m.put(0, "ns", -2)  # the copy of the new size, kept at the release
    snap.release()
    assert len(spare_addresses(m)) == 1
    check_map(m)


@needs_c
def test_growth_allocates_the_new_tables_chunks_as_the_rehash_reaches_them() -> None:
    capacity = 8 * CHUNK_BUCKETS
    m = c_map(initial_capacity=capacity)
    for i in range(capacity * 3 // 4 + 2):  # the insert that finds threshold + 1 starts it
        m.put(HashKey(i, i), 0, i)
    view = MapView(m)
    assert view.rehash_directory is not None and view._rehash_index == 0
    assert [a for a, _ in view.rehash_directory[3]] == [0] * 16  # nothing allocated yet
    m.get(HashKey(0, 0), 0)  # one step: buckets 0..3
    directory = MapView(m).rehash_directory
    assert directory is not None
    allocated = [i for i, (a, _) in enumerate(directory[3]) if a]
    assert allocated == [0, 8]  # chunk of j and of j + L (L: 8 chunks)
    check_map(m)


@pytest.mark.parametrize("impl", list(MAPS))
def test_equal_key_and_namespace_pairs_do_not_share_a_chain(impl: str) -> None:
    m = MAPS[impl]()
    for i in range(4000):
        m.put(i, i, i)
    view = view_of(m)
    tables = [view._primary] if view._rehash is None else [view._primary, view._rehash]
    longest = max(len(chain(head)) for table in tables for head in table)
    assert longest <= 8, f"a chain of {longest} entries: the composite hash collapses"


# --------------------------------------------------- the checker on the C map


@needs_c
def test_a_map_of_ints_and_strs_costs_the_collector_nothing_until_it_holds_a_container() -> None:
    # Invariant 12: tp_traverse returns at once while no live entry holds an
    # object of a GC type, as CPython untracks a dict of such objects.
    assert C_MAP is not None
    m = c_map()
    for i in range(1000):
        m.put(i, "ns", i)
    assert MapView(m).gc_entries == 0 and gc.get_referents(m) == [m.serializer]
    m.put(5, "ns", [5])  # a list state: visited
    assert MapView(m).gc_entries == 1 and [5] in gc.get_referents(m)
    m.put(5, "ns", 5)
    m.put((1, 2), "ns", 0)  # a tuple key is of a GC type
    m.remove(3, "ns")
    assert MapView(m).gc_entries == 1
    check_map(m)


#: Every corruption the probe makes, at the head, in the middle and at the end of
#: a chain of five where it breaks one entry: (kind, position in the chain).
CORRUPTIONS = [
    *[("hash", p) for p in (0, 2, 4)],
    *[("move", p) for p in (0, 2, 4)],
    ("rehash_index", 0),
    ("primary_size", 0),
    ("primary_size_short", 0),
    *[("duplicate", p) for p in (0, 2, 4)],
    *[("state_version", p) for p in (0, 2, 4)],
    ("highest_required", 0),
    *[("shared_entry_version", p) for p in (0, 2, 4)],
    *[("shared_state_version", p) for p in (0, 2, 4)],
    ("write_shared", 0),
    *[("relink", p) for p in (0, 2, 3)],
    ("threshold", 0),
    ("chunk_refs", 0),
    *[("retire_live", p) for p in (0, 2, 4)],
    ("unretire", 0),
    *[("hand_back_live", p) for p in (0, 2, 4)],
    ("gc_entries", 0),
    ("guard", 0),
    ("tracking_since", 0),
    ("removal_limit", 0),
    *[("removal_version", p) for p in (0, 1, 2)],  # the first, middle and last record
]
#: The corruptions that need an open snapshot (a shared chunk, a shared entry
#: or state, a retired entry); the others run without one.
WITH_SNAPSHOT = {
    "highest_required",
    "shared_entry_version",
    "shared_state_version",
    "write_shared",
    "relink",
    "retire_live",
    "unretire",
}
#: The corruptions of invariant 13: the map tracks changes and logged three
#: removals (of mappings outside bucket 3), one per version.
TRACKING = {"guard", "tracking_since", "removal_limit", "removal_version"}


def probe() -> Any:
    assert cmap_view.PROBE is not None, cmap_view.PROBE_ERROR
    return cmap_view.PROBE


def healthy_for(kind: str) -> tuple[Any, list[Any], list[Any]]:
    """A C map of capacity 8 whose bucket 3 chains five mappings (HashKey(4, 3)
    at the head), the probe's fingerprints and the reference's of what it needs
    open, both checkers passing."""
    m = c_map(initial_capacity=8)
    for i in range(5):
        m.put(HashKey(i, 3), 0, [i])
    fps: list[Any] = []
    reference_fps: list[Any] = []
    if kind in WITH_SNAPSHOT:
        snapshot = m.snapshot()
        fps.append(fingerprint(snapshot))
        reference_fps.append(fingerprint(snapshot, reference=True))
    if kind == "unretire":  # rule E copies the chain down to HashKey(2, 3), retiring three
        m.put(HashKey(2, 3), 0, [20])
    if kind in TRACKING:
        m.track_changes(8)
        for i in range(3):
            m.put(HashKey(10 + i, 5), 0, [i])
            m.snapshot().release()
            m.remove(HashKey(10 + i, 5), 0)
    check_map(m, fps)
    check_map(m, reference_fps)
    return m, fps, reference_fps


def violation_message(m: Any, fps: list[Any], *, reference: bool = False) -> str:
    with pytest.raises(InvariantViolation) as info:
        check_map(m, fps, reference=reference)
    return str(info.value)


@needs_c
@pytest.mark.parametrize(("kind", "position"), CORRUPTIONS, ids=lambda x: str(x))
def test_both_checkers_name_the_same_violation_of_every_corruption(
    kind: str, position: int
) -> None:
    m, fps, reference_fps = healthy_for(kind)
    to = {"move": 5, "rehash_index": 1, "highest_required": 0}.get(kind, 0)
    with probe().corrupt(m, kind, 3, position=position, to=to) as corruption:
        assert corruption.active
        by_the_probe = violation_message(m, fps)
        by_the_reference = violation_message(m, reference_fps)
        assert by_the_probe == by_the_reference
        assert by_the_probe.startswith(f"invariant {probe().KINDS[kind]} violated: ")
    assert not corruption.active
    check_map(m, fps)  # undone: both pass again
    check_map(m, reference_fps)


#: The corruptions of invariant 14 (rule M: each live chunk marks its changed
#: buckets), each where the table's first bucket, one in the middle and its last
#: break it: (kind, bucket) of a map of four chunks; for a stray mark (a map of
#: one chunk of 8 buckets) the first bit beyond its buckets, one in the middle
#: of the marks and the last.
MARK_CORRUPTIONS = [
    *[("unmark", bucket) for bucket in (0, 2748, 4095)],
    *[("marks_since", bucket) for bucket in (0, 2748, 4095)],
    *[("stray_mark", bit) for bit in (8, 700, 1023)],
]
#: The buckets of healthy_marked's map of four chunks that hold a mapping: each
#: chunk's first and last, slots in the middle of a word of marks and at a word's
#: edge.
MARKED_BUCKETS = (0, 1, 63, 64, 1023, 1500, 2748, 3071, 3072, 4095)


def test_every_corruption_of_the_probe_is_tested() -> None:
    kinds = {kind for kind, _ in CORRUPTIONS} | {kind for kind, _ in MARK_CORRUPTIONS}
    assert kinds == set(probe().KINDS)
    assert set(probe().KINDS.values()) == set(range(1, 15))  # every invariant has one


def healthy_marked(kind: str) -> Any:
    """A C map that tracks changes, every mapping changed after a snapshot (as
    after a checkpoint: its bucket's mark is needed), both checkers passing:
    four chunks of 1,024 buckets holding MARKED_BUCKETS, or for a stray mark one
    chunk of 8 buckets holding five."""
    capacity = 8 if kind == "stray_mark" else 4 * CHUNK_BUCKETS
    buckets = (0, 1, 3, 6, 7) if kind == "stray_mark" else MARKED_BUCKETS
    m = c_map(initial_capacity=capacity)
    for bucket in buckets:
        m.put(HashKey(bucket, bucket), 0, [bucket])
    m.track_changes(8)
    m.snapshot().release()
    for bucket in buckets:
        m.put(HashKey(bucket, bucket), 0, [bucket, 1])
    view = MapView(m)
    assert view._primary_size == len(buckets) and view._rehash is None
    assert all(view._primary[bucket] is not None for bucket in buckets)
    check_map(m)
    check_map(m, reference=True)
    return m


def where_the_marks_break(kind: str, at: int) -> str:
    """What both messages of a corruption of the marks name: the bucket, its
    chunk, or the stray bit."""
    if kind == "unmark":
        return f"in primary bucket {at} has state version "
    if kind == "marks_since":
        return f"primary chunk {at // CHUNK_BUCKETS} has marks since "
    return f"primary chunk 0 of 8 buckets marks bucket {at} of it"


@needs_c
@pytest.mark.parametrize(("kind", "at"), MARK_CORRUPTIONS, ids=lambda x: str(x))
def test_both_checkers_name_the_same_violation_of_every_corruption_of_the_marks(
    kind: str, at: int
) -> None:
    m = healthy_marked(kind)
    bucket, to = (3, at) if kind == "stray_mark" else (at, 0)
    with probe().corrupt(m, kind, bucket, to=to) as corruption:
        assert corruption.active
        by_the_probe = violation_message(m, [])
        by_the_reference = violation_message(m, [], reference=True)
        assert by_the_probe == by_the_reference
        assert by_the_probe.startswith("invariant 14 violated: ")
        assert where_the_marks_break(kind, at) in by_the_probe, by_the_probe
    assert not corruption.active
    check_map(m)  # undone: both pass again
    check_map(m, reference=True)


@needs_c
def test_the_marks_are_corrupted_only_where_a_tracking_map_needs_them() -> None:
    # Only the live table's own chunks are written (rule C: a chunk a snapshot
    # holds is never), only while tracking (else invariant 14 claims nothing);
    # unmark only a bucket whose bit is needed, a stray mark only beyond the
    # chunk's buckets. A refusal changes nothing.
    untracked = c_map(initial_capacity=8)
    untracked.put(HashKey(3, 3), 0, [3])
    m = healthy_marked("unmark")
    snapshot = m.snapshot()
    refusals = [
        (untracked, "unmark", 3, 0, "needs a map that tracks changes"),
        (m, "marks_since", 2748, 0, "in a chunk no snapshot holds"),
    ]
    for target, kind, bucket, to, message in refusals:
        with pytest.raises(ValueError, match=message):
            probe().corrupt(target, kind, bucket, to=to)
    snapshot.release()
    for kind, bucket, to, message in [
        ("unmark", 2, 0, "nothing there to corrupt: bucket 2 "),  # no mapping there
        ("stray_mark", 2748, 1023, "a bit beyond the chunk's buckets, got 1023"),
    ]:
        with pytest.raises(ValueError, match=message):
            probe().corrupt(m, kind, bucket, to=to)
    m.snapshot().release()
    m.put(HashKey(0, 0), 0, [0, 2])  # chunk 0's marks start over: bucket 0's bit only
    with pytest.raises(ValueError, match="nothing there to corrupt: bucket 1 "):
        probe().corrupt(m, "unmark", 1)
    probe().corrupt(m, "unmark", 0).undo()
    for target in (untracked, m):
        check_map(target)
        check_map(target, reference=True)


def chunk_marks(m: Any, bucket: int) -> tuple[int, tuple[int, ...]]:
    """(marks_since, set bits) of the live primary chunk holding ``bucket``."""
    view = MapView(m)
    slots: int = view.primary_directory[2]
    chunk = view.primary_marks[bucket // slots]
    assert chunk is not None
    return chunk


@needs_c
@pytest.mark.parametrize("change", ["copied", "grown"])
@pytest.mark.parametrize("kind", ["unmark", "marks_since", "stray_mark"])
def test_a_corruption_of_the_marks_is_undone_after_the_map_changed(kind: str, change: str) -> None:
    """The undo finds the damaged chunk again by its bucket, never by a kept
    pointer: rule C's copy (a snapshot holds the chunk, a removal copies it
    and marks nothing) carries the damage and is mended; a map grown meanwhile
    marked what its rehash moved itself, and freed the damaged chunk."""
    m = healthy_marked(kind)
    bucket, to, neighbour = (3, 700, 6) if kind == "stray_mark" else (2748, 0, 3071)
    slot = bucket % CHUNK_BUCKETS
    with probe().corrupt(m, kind, bucket, to=to):
        damaged = chunk_marks(m, bucket)
        if change == "copied":
            snapshot = m.snapshot()
            before = MapView(m).primary_directory[3]
            m.remove(HashKey(neighbour, neighbour), 0)  # the same chunk: rule C copies it
            after = MapView(m).primary_directory[3]
            index = bucket // MapView(m).primary_directory[2]
            assert after[index][0] != before[index][0]  # a copy, carrying the damage
            assert chunk_marks(m, bucket) == damaged
            snapshot.release()
        else:
            keys = (HashKey(10_000 + i, 10_000 + i) for i in range(10_000))
            while probe().rehash_progress(m) is None:  # until it starts,
                m.put(next(keys), 1, 0)
            while probe().rehash_progress(m) is not None:  # and until it ends
                m.put(next(keys), 1, 0)
    check_map(m)
    check_map(m, reference=True)
    if change == "copied":  # mended in the copy
        since, bits = chunk_marks(m, bucket)
        assert since == 1
        assert slot in bits or kind != "unmark"
        assert to not in bits or kind != "stray_mark"


#: What a corruption cannot undo once the map changed structurally: damage that
#: depends on entry pointers stays (the probe warns); the rest is always undone.
LEFT_IN_PLACE = WITH_SNAPSHOT - {"retire_live", "unretire", "highest_required"}


@needs_c
@pytest.mark.parametrize("kind", sorted(WITH_SNAPSHOT))
def test_a_corruption_outlives_changes_of_the_map_and_frees_nothing_twice(kind: str) -> None:
    # The old in-map hook retired a live entry into a batch the map freed: the
    # live table then freed it again (make sanitize saw a double free). Here the
    # map changes structurally, releases and snapshots while corrupted; the end
    # of the corruption repairs what it still can and everything is freed once
    # (this test runs under ASan in make sanitize).
    m, fps, _ = healthy_for(kind)
    warns: Any = (
        pytest.warns(RuntimeWarning, match="left in place")
        if kind in LEFT_IN_PLACE
        else contextlib.nullcontext()
    )
    position = 0 if kind == "write_shared" else 1
    with warns, probe().corrupt(m, kind, 3, position=position):
        fps[0].snapshot.release()
        later = m.snapshot()
        for i in range(40):  # grows: rehash steps relink every chain
            m.put(HashKey(i, 3), 1, [i])
        m.remove(HashKey(1, 3), 0)
        later.release()
    del fps, later, m
    gc.collect()


@needs_c
def test_the_installed_map_cannot_export_or_corrupt_itself() -> None:
    assert C_MAP is not None
    snapshot = c_map().snapshot()
    for cls in (C_MAP, type(snapshot)):
        names = set(dir(cls))
        assert not names & {"_corrupt", "_structure", "_rehash_progress"}, cls
    assert not {n for n in dir(sys.modules[C_MAP.__module__]) if "corrupt" in n}


@needs_c
def test_the_probe_reads_only_maps_of_its_own_layout() -> None:
    # Exact types of attached modules only: a pure map, a look-alike, anything else
    # is refused before a struct is read.
    pure = state_map.CopyOnWriteStateMap[Any, Any, Any]()
    for reader in (probe().structure, probe().rehash_progress, probe().snapshot_structure):
        for wrong in (pure, pure.snapshot(), object(), 3):
            with pytest.raises(TypeError, match="expected a"):
                reader(wrong)
    with pytest.raises(TypeError, match="expected a C map"):
        probe().check(pure, [])
    with pytest.raises(TypeError, match="expected fingerprints of this probe"):
        probe().check(c_map(), [object()])
    assert probe().is_map(c_map()) and not probe().is_map(pure)
    with pytest.raises(ImportError, match="to publish its layout"):
        probe().attach(types.ModuleType("no_layout"))
    module = types.ModuleType("another_layout")
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    for name, version in ((b"cowstate._cmap._LAYOUT", probe().LAYOUT_VERSION + 1), (b"other", 1)):
        layout = (ctypes.c_int * 32)(version)  # version first, then nothing like our sizes
        module._LAYOUT = capsule_new(ctypes.addressof(layout), name, None)  # type: ignore[attr-defined]
        with pytest.raises(ImportError, match="rebuild"):
            probe().attach(module)


@needs_c
def test_check_map_takes_the_fingerprints_of_one_checker() -> None:
    m, fps, reference_fps = healthy_for("relink")
    with pytest.raises(TypeError, match="one checker"):
        check_map(m, [*fps, *reference_fps])
    with pytest.raises(TypeError, match="one checker"):
        check_map(m, fps, reference=True)


@needs_c
def test_both_checkers_accept_a_healthy_map_as_it_grows_under_snapshots() -> None:
    # Collisions, growth from capacity 4 with up to three snapshots open, rule E and
    # S copies, releases out of order: the probe's checker and the reference pass
    # alike (a false alarm of either fails here), after every snapshot and release
    # and every third other operation (the reference costs an export each time).
    rng = random.Random(26)
    m = c_map(initial_capacity=4)
    open_: list[tuple[Any, Any, Any]] = []
    rehashing_snapshots = 0
    for step in range(1000):
        value = rng.randrange(150)
        key, ns = HashKey(value, value % 7), rng.randrange(2)
        op = rng.random()
        check_now = step % 3 == 0
        if op < 0.55:
            m.put(key, ns, [step])
        elif op < 0.65:
            m.remove(key, ns)
        elif op < 0.75:
            state = m.get(key, ns)
            if state is not None:
                state.append(step)  # mutates only a private copy (rule S)
        elif op < 0.85:
            m.transform(key, ns, step, lambda old, v: [v] if old is None else [*old, v])
        elif op < 0.93 and len(open_) < 3:
            rehashing_snapshots += cmap_view.rehash_progress(m) is not None
            s = m.snapshot()
            open_.append((s, fingerprint(s), fingerprint(s, reference=True)))
            check_now = True
        elif open_:
            s, _, _ = open_.pop(rng.randrange(len(open_)))
            s.release()
            check_now = True
        if check_now:
            check_map(m, [fp for _, fp, _ in open_])
            check_map(m, [fp for _, _, fp in open_])
    assert rehashing_snapshots >= 3 and describe(m).capacity >= 256


@needs_c
@pytest.mark.parametrize("release", ["release", "hand_back"])
@pytest.mark.parametrize("read", ["items", "iterate"])
def test_a_finalizer_that_releases_a_snapshot_while_it_is_read_frees_nothing_early(
    read: str, release: str
) -> None:
    # Copying entries into tuples may run the GC, and the GC any finalizer: here
    # one that releases the snapshot being read. The C snapshot is pinned while
    # read, and the release finishes once the read ends.
    assert C_MAP is not None
    m = c_map(initial_capacity=4)
    for i in range(200):
        m.put(i, "ns", [i])
    snap = m.snapshot()
    for i in range(200):
        m.remove(i, "ns")  # every entry now lives only in the snapshot

    class Releaser:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            if not snap.is_released:
                getattr(snap, release)()  # hand_back: rule G once the read ends

    Releaser()  # garbage in a cycle: the next GC releases snap
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        if read == "items":
            items = snap.items()
            assert sorted(k for k, _, _ in items) == list(range(200))
            assert all(s == [k] for k, _, s in items)
        else:
            seen = []
            with pytest.raises(cowstate.SnapshotReleasedError, match="released"):
                for e in snap:
                    seen.append(e.key)
                    assert e.state == [e.key]
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    assert snap.is_released and not m._open_versions
    assert m.pending_reclaim == (200 if release == "hand_back" else 0)
    check_map(m)
    assert m.reclaim() == (200 if release == "hand_back" else 0)
    assert m.pending_reclaim == 0
    check_map(m)
