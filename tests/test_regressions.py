"""Regression tests: every bug found gets a test named after what it fixes.

Step lists printed by a failing state machine are pasted here as ordinary
tests (see CONTRIBUTING.md, "Replaying a failure"): the same calls in the
same order, then the invariants.
"""

from __future__ import annotations

import io
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from pathlib import Path
from typing import IO, Any, cast

import pytest
import restore_support

from cowstate import ConcurrentModificationError, CopyOnWriteStateMap
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation
from cowstate.errors import TruncatedSnapshotError, UnhashableKeyError
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.introspection import describe
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.keyed_backend import SnapshotFuture
from cowstate.nested_table import NestedMapsStateTable
from cowstate.snapshot import SnapshotReader
from cowstate.state_table import CopyOnWriteStateTable, StateTable
from cowstate_spec.bad_implementations import BUGS, bad_implementation
from cowstate_spec.implementations import by_name
from cowstate_spec.keys import HashKey
from cowstate_spec.machine import StateMapMachine, machine_for


def check_all(state: StateMapMachine) -> None:
    state.open_snapshots_never_change()
    state.sizes_agree()
    state.structure_holds()


def replay_remove_and_get_old_of_a_snapshotted_state(state: StateMapMachine) -> None:
    """Step list the machine printed for the bug 'remove-and-get-old-returns-shared-state'."""
    check_all(state)
    state.put_and_get_old(item=0, kn=(1, 0), state=[])
    check_all(state)
    state.snapshot()
    check_all(state)
    state.remove_and_get_old(item=0, kn=(1, 0))
    check_all(state)
    state.teardown()


def test_remove_and_get_old_copies_a_state_a_snapshot_still_holds() -> None:
    replay_remove_and_get_old_of_a_snapshotted_state(machine_for(by_name("cow-map"))())
    bug = next(b for b in BUGS if b.name == "remove-and-get-old-returns-shared-state")
    with pytest.raises(AssertionError, match="snapshot 1 changed"):
        replay_remove_and_get_old_of_a_snapshotted_state(machine_for(bad_implementation(bug))())


def test_iterator_detects_a_change_made_before_its_first_next() -> None:
    # The iterator used to read the modification counters lazily, at the first
    # next(), so a put between iter() and next() went unnoticed.
    m: CopyOnWriteStateMap[Any, Any, Any] = CopyOnWriteStateMap()
    m.put(1, 0, 1)
    entries = iter(m)
    m.put(2, 0, 2)
    with pytest.raises(ConcurrentModificationError):
        next(entries)


def test_transform_with_a_failing_function_does_not_step_the_rehash() -> None:
    # transform used to run its rehash step before calling the function, so a
    # refused call still changed the map's bookkeeping.
    m: CopyOnWriteStateMap[Any, Any, Any] = CopyOnWriteStateMap(initial_capacity=4)
    for i in range(5):
        m.put(i, 0, i)
    before = describe(m)
    assert before.is_rehashing
    with pytest.raises(Exception, match="refuses"):
        m.transform(1, 0, 1, lambda old, v: (_ for _ in ()).throw(ValueError("refuses")))
    assert describe(m) == before


def test_runner_never_mutates_the_operation_list() -> None:
    # The runner used to hand the state objects of put operations to the
    # implementation itself; a later get-and-mutate then changed the operation
    # list, so a minimized trace no longer replayed what had diverged.
    from cowstate_spec.differential import run_workload
    from cowstate_spec.workloads import WorkloadSpec, operations

    spec = WorkloadSpec(operations_per_workload=800, state_kinds=["list", "dict"])
    ops = operations(spec, 0)
    assert not run_workload(by_name("cow-map"), ops).diverged
    assert ops == operations(spec, 0)


def test_the_sweep_rule_gets_a_mapping_equal_to_a_removed_one() -> None:
    # get_and_mutate_every_mapping used to pick the mappings it got by "not in
    # removed": HashKeys of one value and other hashes are equal yet two
    # mappings, so the rule skipped the get of every mapping equal to a removed
    # one (under the ci seed, the entries a chain copy had left sharing their
    # states: c-get-checks-entry-version went unseen).
    state = machine_for(by_name("cow-map"))()
    first, second, third = (HashKey(1, 64), None), (HashKey(1, 4), None), (3, None)
    assert first == second
    for kn in (first, second, third):
        state.put(kn=kn, state=[])
    state.snapshot()
    state.get_and_mutate_every_mapping(item=7, newest_first=False)
    check_all(state)
    assert state.impl.get(*second) == [7], "the mapping between the removed ones was not got"
    assert state.impl.get(*first) == state.impl.get(*third) == []
    state.teardown()


class _TrickleStream(io.RawIOBase):
    """A seekable raw stream that returns at most ``chunk`` bytes per read, as
    ``io.RawIOBase`` allows (a pipe, a socket, a slow network file)."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self._data, self._chunk, self._at = data, chunk, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._data)}[whence]
        self._at += offset
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer: Any) -> int:
        piece = self._data[self._at : self._at + min(self._chunk, len(buffer))]
        buffer[: len(piece)] = piece
        self._at += len(piece)
        return len(piece)


def test_a_snapshot_read_from_a_raw_stream_with_short_reads_is_read_whole() -> None:
    # The reader took any read shorter than asked for a truncated file
    # ("expected 16 bytes of the header at offset 0, got 8"); a raw stream may
    # return fewer bytes than it holds, so it reads again until the end.
    data = restore_support.crafted(restore_support.by_group([(k, "a", [k]) for k in range(40)]))
    whole = SnapshotReader(data)
    trickled = SnapshotReader(cast("IO[bytes]", _TrickleStream(data, chunk=8)))
    assert trickled.metadata == whole.metadata
    assert trickled.offsets == whole.offsets
    for key_group in whole.offsets:
        assert trickled.read_key_group(key_group) == whole.read_key_group(key_group)


def test_a_snapshot_cut_after_it_was_opened_is_still_truncated() -> None:
    # ... but the end of the stream before the length is still a truncation.
    data = restore_support.crafted(restore_support.by_group([(k, "a", [k]) for k in range(40)]))
    stream = io.BytesIO(data)
    reader = SnapshotReader(stream)
    last = max(reader.offsets)
    stream.truncate(reader.offsets[last] + 5)
    with pytest.raises(TruncatedSnapshotError, match=rf"at offset {reader.offsets[last]}, got 5$"):
        reader.read_key_group(last)


@pytest.mark.parametrize("table_class", [CopyOnWriteStateTable, NestedMapsStateTable])
def test_an_unhashable_key_outside_a_sub_range_is_refused_as_unhashable(
    table_class: type[StateTable[Any, Any, Any]],
) -> None:
    # A list key whose key group fell outside a sub-range table's range raised
    # KeyGroupOutOfRangeError ("most likely a key whose hash or equality is not
    # deterministic"); inside the range, and on RocksDB, UnhashableKeyError.
    table = table_class(KeyGroupRange(0, 9), 128)
    assert assign_to_key_group([0], 128) == 111  # outside
    assert assign_to_key_group([3], 128) == 3  # inside
    for key in ([0], [3]):
        with pytest.raises(UnhashableKeyError) as excinfo:
            table.put(key, "ns", 1)
        assert str(excinfo.value) == f"expected a hashable key, got list {key!r}"
    assert len(table) == 0


def test_a_snapshot_future_cancelled_before_its_writer_starts_is_done_for_wait() -> None:
    # A backend's SnapshotFuture (RocksDB's snapshot_to, the heap's snapshot)
    # cancelled before the writer thread reached it was not notified -- no
    # executor runs it -- and concurrent.futures.wait() / as_completed() count
    # a cancelled future as done only once notified: they waited for the
    # writer thread, or out their timeout.
    released: list[int] = []
    future: SnapshotFuture[int] = SnapshotFuture(1, lambda: released.append(1))
    assert future.cancel() and future.cancelled()
    done, not_done = wait([future], timeout=0)
    assert (done, not_done) == ({future}, set())
    assert list(as_completed([future], timeout=0)) == [future]
    assert future.cancel()  # again: still cancelled, notified and released once
    assert released == [1]
    assert not future.start()  # the writer thread reaching it does not run it
    running: SnapshotFuture[int] = SnapshotFuture(2, lambda: released.append(2))
    assert running.start()
    assert running.cancel() and not running.cancelled()  # requested: the writer stops
    assert running.cancel_requested.is_set() and released == [1]


@pytest.mark.parametrize("api", ["snapshot_to", "snapshot"])
def test_a_queued_heap_snapshot_cancelled_by_its_owner_is_done_for_wait(
    tmp_path: Path, api: str
) -> None:
    # What a coordinator's abort (and close) of a just-triggered checkpoint
    # does: cancel the heap backend's future of snapshot_to while its writer
    # is still queued, then wait for it -- which blocked until the timeout
    # (and the stream API's future until the writer thread reached it).
    release = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as executor:
        executor.submit(release.wait, 30)  # the one writer thread is busy
        backend = HeapKeyedStateBackend(
            KeyGroupRange(0, 15),
            16,
            key_serializer=restore_support.SER,
            namespace_serializer=restore_support.SER,
            executor=executor,
        )
        try:
            backend.get_state(restore_support.VALUE)
            restore_support.fill(backend, range(10))
            location = SnapshotLocation(FileSystem(), str(tmp_path / "chk-1"), None)
            future: Future[Any] = (
                backend.snapshot_to(1, location, SnapshotOptions())
                if api == "snapshot_to"
                else backend.snapshot(1, io.BytesIO)
            )
            assert future.cancel() and future.cancelled()
            assert wait([future], timeout=0).done == {future}
        finally:
            release.set()
            backend.close()
    assert backend.pending_snapshots == 0
