"""The semantic checks of snapshot contents (cowstate.snapshot.checks, E1-E6):
files crafted with the real writer's building blocks -- every CRC, the index
and the metadata valid -- whose entries no table can keep are refused by every
restore path with a precise error naming the state, the key group and what was
wrong, and nothing is restored.

Each crafted case is also shown to be harmful: with the check switched off
(a deliberately broken restore) the same file restores wrong data. At the end,
every check with its offending entry first, in the middle, last in a block
and in the last block (RocksDB native files too): a check of the first entry
only fails there (tests/test_spec_catches_bad_checks.py).
"""

from __future__ import annotations

import bisect
import functools
import io
import pickle
import pickletools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from restore_support import (
    ABSOLUTE,
    FULL,
    MAX_P,
    SER,
    STATE_META,
    VALUE,
    Contents,
    Entry,
    Registered,
    Targets,
    built_once,
    by_group,
    crafted,
    crafted_raw,
    dump,
    fill,
    group_of,
    handle_for,
    heap,
    metadata_of,
    native_snapshot,
    raw_blocks,
    rocks,
    staged_databases,
)
from test_key_groups import VECTORS, key_of

from cowstate import errors
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.descriptors import ListStateDescriptor, ValueStateDescriptor
from cowstate.errors import (
    CowStateError,
    DuplicateMappingError,
    KeyGroupMismatchError,
    MixedKeyTypesError,
    SerializerMismatchError,
    SnapshotEntryError,
    SnapshotFormatError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.keyed_backend import AbstractKeyedStateBackend
from cowstate.maps import FORCED_PURE
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.rocksdb.table import encode_rocks_key
from cowstate.serializers import DefaultSerializer, IntSerializer, LongSerializer, StringSerializer
from cowstate.snapshot import SnapshotMetadata, SnapshotWriter, checks, read_snapshot, restore_table
from cowstate.state_meta import SnapshotFormat, StateKind, StateMetadata, StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable

try:
    from cowstate import _keygroups
except ImportError:  # pragma: no cover - the extension did not build
    _keygroups = None  # type: ignore[assignment]

KEYS = range(40)
#: A key and a key group that is not its own.
KEY = 7
FOREIGN = (group_of(KEY) + 1) % MAX_P


def good_entries() -> list[Entry]:
    return [(k, ns, f"{ns}{k}") for k in KEYS for ns in ("a", "b")]


# ------------------------------------------------------------ restore paths

#: A restore path: restores ``data`` (one file) into a target holding state
#: (when it has one); returns the target's contents, or None without a target.
Restore = Callable[[bytes, Path], Contents | None]


def _into(
    backend: AbstractKeyedStateBackend[Any], restore: Callable[[], None], *, shared: bool = False
) -> Contents:
    """``restore()`` into ``backend`` (given state of its own, then closed; a
    ``shared`` one of :class:`Targets` holds its own and stays open) leaves it
    as it was."""
    if not shared:
        fill(backend, range(100, 130), tag="mine")
    before = dump(backend)
    try:
        restore()
    finally:
        after = dump(backend)
        if not shared:
            backend.close()
    assert after == before, "a refused restore changed the backend"
    return after


def heap_restore(data: bytes, tmp: Path) -> Contents | None:
    b = heap()
    return _into(b, lambda: b.restore([data]))


def heap_restore_into_a_fresh_backend(data: bytes, tmp: Path) -> Contents | None:
    b = heap()
    try:
        b.restore([data])
    finally:
        assert dump(b) == {"value": {}}
        b.close()
    return None


def heap_restore_from_canonical(data: bytes, tmp: Path) -> Contents | None:
    b = heap()
    handle = handle_for(tmp / "sp" / "file", data)
    return _into(b, lambda: b.restore_from([handle], SnapshotSource(FileSystem(), "/")))


def heap_restore_from_heap_handle(data: bytes, tmp: Path) -> Contents | None:
    b = heap()
    heap_data = rewritten_as(data, SnapshotFormat.HEAP)
    handle = handle_for(tmp / "chk" / "file", heap_data, snapshot_format=SnapshotFormat.HEAP)
    return _into(b, lambda: b.restore_from([handle], SnapshotSource(FileSystem(), "/")))


def rocksdb_restore_from_canonical(data: bytes, tmp: Path) -> Contents | None:
    b = rocks(tmp / "local")
    handle = handle_for(tmp / "sp" / "file", data, backend="rocksdb")
    contents = _into(b, lambda: b.restore_from([handle], SnapshotSource(FileSystem(), "/")))
    assert staged_databases(tmp / "local") == 1, "a refused restore left a database behind"
    return contents


def table_restore(data: bytes, tmp: Path) -> Contents | None:
    meta = StateMetaInfo("value", StateKind.VALUE, SER, SER)
    table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
        FULL, MAX_P, meta=meta, key_serializer=SER
    )
    table.put(100, "a", "mine")
    try:
        restore_table(table, [data])
    finally:
        assert {(e.key, e.namespace): e.state for e in table} == {(100, "a"): "mine"}
    return None


def plain_read(data: bytes, tmp: Path) -> Contents | None:
    read_snapshot(data, FULL, max_parallelism=MAX_P, key_serializer=SER, metas=METAS)
    return None


METAS = {"value": StateMetaInfo("value", StateKind.VALUE, SER, SER)}
PATHS: dict[str, Restore] = {
    "heap.restore": heap_restore,
    "heap.restore-fresh": heap_restore_into_a_fresh_backend,
    "heap.restore_from(canonical)": heap_restore_from_canonical,
    "heap.restore_from(heap)": heap_restore_from_heap_handle,
    "rocksdb.restore_from(canonical)": rocksdb_restore_from_canonical,
    "restore_table": table_restore,
    "read_snapshot": plain_read,
}
#: read_snapshot returns lists: it leaves E4 to whoever fills a table.
FILLING = {k: v for k, v in PATHS.items() if k != "read_snapshot"}


def rewritten_as(data: bytes, snapshot_format: SnapshotFormat) -> bytes:
    """The same raw entries in a file of another format."""
    return crafted_raw(raw_blocks(data), snapshot_format=snapshot_format)


def refused(
    restore: Restore,
    data: bytes,
    tmp: Path,
    error: type[CowStateError],
    *fragments: str,
    state: str = "value",
) -> None:
    with pytest.raises(error) as excinfo:
        restore(data, tmp)
    message = str(excinfo.value)
    assert type(excinfo.value) is error, repr(excinfo.value)
    for fragment in ("expected", f"'{state}'", *fragments):
        assert fragment in message, (fragment, message)


@pytest.fixture(params=list(PATHS))
def path(request: pytest.FixtureRequest) -> Restore:
    return PATHS[request.param]


@pytest.fixture(params=list(FILLING))
def filling(request: pytest.FixtureRequest) -> Restore:
    return FILLING[request.param]


# ------------------------------------------------------------------ E3


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_the_control_file_restores(kind: str, tmp_path: Path) -> None:
    """The crafted files below differ from this one in one entry or block."""
    data = crafted(by_group(good_entries()))
    expected = {"value": {(k, ns): s for k, ns, s in good_entries()}}
    b = heap() if kind == "heap" else rocks(tmp_path / "local")
    b.restore_from(
        [handle_for(tmp_path / "f", data, backend=kind)], SnapshotSource(FileSystem(), "/")
    )
    assert dump(b) == expected
    if kind == "heap":
        fresh = heap()
        fresh.restore([data])
        assert dump(fresh) == expected
    b.close()


def test_a_key_in_another_key_groups_block_is_refused(path: Restore, tmp_path: Path) -> None:
    blocks = by_group(good_entries())
    blocks.setdefault(FOREIGN, []).append((KEY, "c", "planted"))
    refused(
        path,
        crafted(blocks),
        tmp_path,
        KeyGroupMismatchError,
        f"key group {FOREIGN}",
        f"key {KEY!r}",
        f"whose key group is {group_of(KEY)}",
    )


def test_a_block_moved_to_another_key_groups_slot_is_refused(path: Restore, tmp_path: Path) -> None:
    """Two blocks swapped, headers, CRCs and index rewritten to match their slots."""
    blocks = raw_blocks(crafted(by_group(good_entries())))
    first, second = sorted(kg for kg, rows in blocks.items() if rows)[:2]
    blocks[first], blocks[second] = blocks[second], blocks[first]
    refused(path, crafted_raw(blocks), tmp_path, KeyGroupMismatchError, f"key group {first}")


def test_keys_without_a_stable_key_group_are_refused(path: Restore, tmp_path: Path) -> None:
    blocks = by_group(good_entries())
    blocks.setdefault(0, []).append((frozenset({1}), "a", "x"))
    refused(path, crafted(blocks), tmp_path, SnapshotEntryError, "key group 0", "frozenset")


@pytest.mark.parametrize("accelerated", [True, False], ids=["c", "python"])
def test_both_key_group_checks_find_the_planted_key(
    accelerated: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if not accelerated:
        monkeypatch.setattr(checks, "_keygroups", None)
    elif _keygroups is None:
        # Like the C map (test_implementations.py): CI builds it, so its absence
        # fails unless pure Python is forced.
        if FORCED_PURE:
            pytest.skip("COWSTATE_PURE_PYTHON is set and cowstate._keygroups did not build")
        pytest.fail("cowstate._keygroups did not build (setup.py build_ext --inplace)")
    for keys in ([KEY], ["seven"], [(KEY, "x")], [2**80], [KEY, 1.5, b"k"]):
        entries = [(k, "a", "x") for k in keys]
        planted = {
            FOREIGN if i == len(entries) - 1 else group_of(e[0]): [e] for i, e in enumerate(entries)
        }
        if group_of(keys[-1]) == FOREIGN:
            continue  # the planted key happens to be at home
        refused(
            heap_restore, crafted(planted), tmp_path, KeyGroupMismatchError, f"key group {FOREIGN}"
        )


def test_without_the_key_group_check_the_planted_key_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broken variant: what the check prevents (a key no lookup finds)."""
    monkeypatch.setattr("cowstate.snapshot.restore.check_key_groups", lambda *args: None)
    blocks = by_group(good_entries())
    blocks.setdefault(FOREIGN, []).append((KEY, "c", "planted"))
    b = heap()
    b.restore([crafted(blocks)])  # accepted
    assert (KEY, "c") in dump(b)["value"]  # iteration sees it ...
    b.set_current_key(KEY)
    b.set_current_namespace("c")
    assert b.get_state(VALUE).value() is None  # ... its own key does not
    b.close()


# --------------------------------------------------------------- E1, E2


NONE_CASES: dict[str, tuple[Entry, str]] = {
    "None key": ((None, "a", "x"), "key"),
    "None namespace": ((KEY, None, "x"), "namespace"),
    "None state": ((KEY, "a", None), "state"),
}


@pytest.mark.parametrize("case", list(NONE_CASES))
def test_none_keys_namespaces_and_states_are_refused(
    case: str, path: Restore, tmp_path: Path
) -> None:
    entry, role = NONE_CASES[case]
    blocks = by_group(good_entries())
    blocks[group_of(KEY)].append(entry)
    refused(
        path,
        crafted(blocks),
        tmp_path,
        SnapshotEntryError,
        f"key group {group_of(KEY)}",
        f"whose {role} is None",
    )


@pytest.mark.parametrize("role", ["key", "namespace"])
def test_unhashable_keys_and_namespaces_are_refused(
    role: str, path: Restore, tmp_path: Path
) -> None:
    bad = [1, 2]
    entry: Entry = (bad, "a", "x") if role == "key" else (KEY, bad, "x")
    kg = assign_to_key_group(bad, MAX_P, SER) if role == "key" else group_of(KEY)
    blocks = by_group(good_entries())
    blocks.setdefault(kg, []).append(entry)
    refused(
        path,
        crafted(blocks),
        tmp_path,
        SnapshotEntryError,
        f"key group {kg}",
        f"expected hashable {role}s",
        "list",
    )


def test_undecodable_entries_are_refused(path: Restore, tmp_path: Path) -> None:
    blocks = raw_blocks(crafted(by_group(good_entries())))
    kg = group_of(KEY)
    namespace, key, _ = blocks[kg][0]
    blocks[kg][0] = (namespace, key, b"\x80\x05 not a pickle")
    refused(
        path,
        crafted_raw(blocks),
        tmp_path,
        SnapshotFormatError,
        f"key group {kg}",
        "that its serializers can decode",
    )


# ------------------------------------------------------------------ E4


def test_a_mapping_given_twice_is_refused(filling: Restore, tmp_path: Path) -> None:
    blocks = by_group(good_entries())
    kg = group_of(KEY)
    blocks[kg].append((KEY, "a", "again"))
    refused(
        filling,
        crafted(blocks),
        tmp_path,
        DuplicateMappingError,
        f"key group {kg}",
        f"({KEY!r}, 'a') twice",
    )


def test_without_the_duplicate_check_a_mapping_is_silently_replaced() -> None:
    """The broken variant: read_snapshot alone (no E4) keeps both, a table one."""
    blocks = by_group(good_entries())
    blocks[group_of(KEY)].append((KEY, "a", "again"))
    restored = read_snapshot(crafted(blocks), FULL, key_serializer=SER, metas=METAS)
    assert restored.size("value") == len(good_entries()) + 1


# ------------------------------------------------------- RocksDB native


def test_rocksdb_rescaling_restore_checks_the_entries_it_copies(tmp_path: Path) -> None:
    """Native files hold RocksDB keys: an entry planted under another key
    group's prefix (or a None state) in the handle a rescaling restore copies
    from is refused."""
    low, high = KeyGroupRange(0, 7), KeyGroupRange(8, 15)
    key = next(k for k in range(1000) if group_of(k) in (10, 11))  # copied from high
    plants = {
        "foreign key group": (
            encode_rocks_key(9 if group_of(key) != 9 else 10, pickle.dumps(key), pickle.dumps("c")),
            pickle.dumps("x"),
            KeyGroupMismatchError,
            "whose key group is",
        ),
        "None state": (
            encode_rocks_key(group_of(key), pickle.dumps(key), pickle.dumps("a")),
            pickle.dumps(None),
            SnapshotEntryError,
            "whose state is None",
        ),
    }
    for case, (rocks_key, value, error, fragment) in plants.items():
        root = tmp_path / case.replace(" ", "-")
        handles = []
        for r in (low, high):
            b = rocks(root / "local", r)
            fill(b, KEYS)
            if r == high:
                b.table("value")._column().put(rocks_key, value)
            location = SnapshotLocation(FileSystem(), str(root / "chk-1"), str(root / "shared"))
            handles.append(b.snapshot_to(1, location, SnapshotOptions()).result(30))
            b.close()
        target = rocks(root / "local", KeyGroupRange(4, 11))
        fill(target, range(100, 130), tag="mine")
        before = dump(target)
        with pytest.raises(error) as excinfo:
            target.restore_from(handles, SnapshotSource(FileSystem(), str(root / "chk-1")))
        assert type(excinfo.value) is error and fragment in str(excinfo.value), case
        assert "'value'" in str(excinfo.value)
        assert dump(target) == before
        assert staged_databases(root / "local") == 1, "the staged database was left behind"
        target.close()


# --------------------------------------------------------- the C key groups

KEY_STRATEGY = st.recursive(
    st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.integers(min_value=-(2**31), max_value=2**31 - 1),
        st.text(),
        st.floats(allow_nan=True),
        st.binary(max_size=8),
        st.booleans(),
    ),
    lambda inner: st.tuples(inner, inner) | st.tuples(inner, st.none(), inner),
    max_leaves=6,
)


@pytest.mark.skipif(_keygroups is None, reason="cowstate._keygroups did not build")
@given(
    keys=st.lists(KEY_STRATEGY, max_size=20),
    max_parallelism=st.sampled_from([1, 7, 128, 4096, 32768]),
)
def test_the_c_key_groups_are_assign_to_key_group(keys: list[Any], max_parallelism: int) -> None:
    for serializer in (None, LongSerializer(), IntSerializer()):
        long_keys = serializer is not None and serializer.identifier == "int64"
        got = _keygroups.key_groups(keys, max_parallelism, long_keys)
        # one key at a time (the key context's set_current_key) as in a list
        assert [_keygroups.key_group(key, max_parallelism, long_keys) for key in keys] == got
        for key, group in zip(keys, got, strict=True):
            try:
                expected = assign_to_key_group(key, max_parallelism, serializer)
            except CowStateError:  # a big int the serializer refuses: Python's to report
                assert group == -1, (key, group)
                continue
            assert group in (expected, -1), (key, group, expected)
            if not _holds_a_big_int(key):
                assert group == expected, (key, group, expected)  # only big ints are left
        for kg in set(got) - {-1}:
            first = _keygroups.first_not_in(keys, kg, max_parallelism, long_keys, 0)
            assert first == next((i for i, g in enumerate(got) if g != kg), len(keys))


def _holds_a_big_int(key: Any) -> bool:
    """An int beyond int64 anywhere in ``key``: hashed through the serializer's bytes."""
    if type(key) is tuple:
        return any(_holds_a_big_int(field) for field in key)
    return type(key) is int and not -(2**63) <= key < 2**63


@pytest.mark.skipif(_keygroups is None, reason="cowstate._keygroups did not build")
def test_the_c_key_groups_match_the_java_vectors() -> None:
    checked = 0
    for vector in VECTORS["keys"]:
        key = key_of(vector)
        for max_parallelism, expected in vector["key_groups"].items():
            long_keys = vector["type"] == "long" and -(2**31) <= key < 2**31
            got = _keygroups.key_groups([key], int(max_parallelism), long_keys)
            assert got == [expected], (vector, max_parallelism)
            assert _keygroups.key_group(key, int(max_parallelism), long_keys) == expected
            checked += 1
    assert checked > 100


@pytest.mark.skipif(_keygroups is None, reason="cowstate._keygroups did not build")
def test_the_c_key_groups_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_parallelism"):
        _keygroups.key_groups([1], 0, False)
    with pytest.raises(TypeError):
        _keygroups.key_groups(5, 128, False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expected max_parallelism in 1\.\.32768, got 0"):
        _keygroups.key_group(1, 0, False)
    with pytest.raises(TypeError, match="takes key, max_parallelism and long_keys, got 2"):
        _keygroups.key_group(1, 128)  # type: ignore[call-arg]


# ------------------------------------------------------------- hierarchy


def test_a_serializer_mismatch_is_a_snapshot_format_error() -> None:
    assert issubclass(SerializerMismatchError, SnapshotFormatError)
    assert issubclass(SnapshotEntryError, SnapshotFormatError)
    assert issubclass(DuplicateMappingError, SnapshotEntryError)
    for name in ("SnapshotEntryError", "DuplicateMappingError", "CorruptStorageError"):
        assert name in errors.__all__


# ------------------------------------------------------ the decoding loop


def test_runs_of_one_namespace_decode_exactly() -> None:
    """The loop reuses the previous entry's namespace when the same frame
    follows: runs, alternations, the empty namespace, a namespace whose bytes
    are another's prefix, all decode to exactly what was written."""
    namespaces = ["", "", "w", "w", "", "ww", "w", "a" * 300, "a" * 300, "", "x"]
    entries = [(k, ns, f"s{i}") for i, ns in enumerate(namespaces) for k in (KEY, KEY + 1)]
    blocks: dict[int, list[Entry]] = {}
    for key, ns, state in entries:
        blocks.setdefault(group_of(key), []).append((key, ns, state))
    utf8 = StringSerializer()
    raw = {
        kg: [(utf8.serialize(ns), pickle.dumps(key), pickle.dumps(s)) for key, ns, s in rows]
        for kg, rows in blocks.items()
    }
    metas = {"value": StateMetaInfo("value", StateKind.VALUE, utf8, SER)}
    data = crafted_raw(raw, namespace_serializer=utf8.identifier)
    restored = read_snapshot(data, FULL, key_serializer=SER, metas=metas)
    assert sorted(restored.entries("value")) == sorted(
        (group_of(k), k, ns, s) for k, ns, s in entries
    )
    for block in restored.blocks["value"].values():  # one object per distinct namespace
        assert len({id(ns) for ns in block.namespaces}) == len(set(block.namespaces))


# ------------------------------------------------------------------ E5


def kinds_file(kind: StateKind, states: list[Any]) -> tuple[bytes, SnapshotMetadata]:
    """A canonical file of one state ``items`` of ``kind`` (default value codec)
    whose entry for ``KEYS[i]`` holds ``states[i]``; every CRC valid."""
    codec = DefaultSerializer()
    meta = metadata_of().model_copy(
        update={
            "states": (
                StateMetadata(
                    id=0,
                    name="items",
                    kind=kind,
                    namespace_serializer=SER.identifier,
                    state_serializer=codec.identifier,
                ),
            )
        }
    )
    raw: dict[int, list[tuple[bytes, bytes, bytes]]] = {}
    for key, state in zip(KEYS, states, strict=False):
        row = (pickle.dumps("a"), pickle.dumps(key), codec.serialize(state))
        raw.setdefault(group_of(key), []).append(row)
    stream = io.BytesIO()
    writer = SnapshotWriter(stream, meta)
    for kg in sorted(raw):
        writer.write_key_group(kg, {0: raw[kg]})
    writer.finish()
    return stream.getvalue(), meta


def restore_fresh(kind: str, data: bytes, meta: SnapshotMetadata, tmp: Path) -> Contents:
    """``data`` restored into a fresh backend (no state registered: it adopts
    the file's kinds and serializers); a refused restore leaves it empty."""
    backend: AbstractKeyedStateBackend[Any]
    if kind == "heap":
        backend = HeapKeyedStateBackend(FULL, MAX_P, key_serializer=SER, namespace_serializer=SER)
    else:
        backend = RocksDBKeyedStateBackend(
            FULL, MAX_P, local_dir=tmp / "local", key_serializer=SER, namespace_serializer=SER
        )
    handle = handle_for(tmp / "sp" / "file", data, backend=kind).model_copy(
        update={"states": meta.states}
    )
    try:
        backend.restore_from([handle], SnapshotSource(FileSystem(), "/"))
    finally:
        contents = dump(backend)
        backend.close()
    return contents


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@pytest.mark.parametrize(
    ("kind", "good", "bad", "holds"),
    [
        (StateKind.LIST, lambda k: [k, k + 1], 7, "list"),
        (StateKind.MAP, lambda k: {k: "v"}, [7], "dict"),
    ],
    ids=["list", "map"],
)
def test_a_state_that_is_not_what_its_kind_holds_is_refused(
    backend: str, kind: StateKind, good: Callable[[int], Any], bad: Any, holds: str, tmp_path: Path
) -> None:
    """E5: an edited serializer id or kind makes a list state's entries decode
    as ints; the restore refuses it instead of failing at the first ``add``."""
    states = [good(k) for k in KEYS]
    data, meta = kinds_file(kind, states)
    assert restore_fresh(backend, data, meta, tmp_path / "control") == {
        "items": {(k, "a"): s for k, s in zip(KEYS, states, strict=True)}
    }
    states[len(states) // 2] = bad
    data, meta = kinds_file(kind, states)
    with pytest.raises(SnapshotEntryError, match=f"'items'.*to be a {holds}") as excinfo:
        restore_fresh(backend, data, meta, tmp_path / "planted")
    assert f"got a state of type {type(bad).__name__}" in str(excinfo.value)


# ------------------------------------------------ wherever the entry stands
#
# A check that looks at the first entry of a block only, or skips the last
# block, passes the tests above: their offending entry stands wherever the
# crafted block happens to put it. Each check is tested here with the
# offending entry first, in the middle and last in the block of a key group
# inside the file (INNER), and last in the file's last block (LAST), through
# each call that runs the check: the heap restore (the decoding loop of
# read_snapshot, the heap's fill and key types), restore_table (its own E4 and
# E6), the RocksDB restore of canonical files (its own decoding loop, its calls
# of E3, E5, E6 and E4 on raw keys), a rescaling RocksDB restore of native
# files (the rows of the key groups it copies) and a native restore kept as it
# is (E6 on the first key of each column family). cowstate_spec.bad_checks
# plants the sampling defect in each check;
# tests/test_spec_catches_bad_checks.py requires these tests to fail on it, at
# exactly the positions it misses.

POSITIONS = ("first", "middle", "last", "last-block")
#: The key group whose block holds the first three positions (neither the
#: file's first block nor its last; 10 entries), and the last block's.
INNER = 6
LAST = MAX_P - 1
LIST_META = StateMetadata(
    id=0,
    name="items",
    kind="list",
    namespace_serializer=SER.identifier,
    state_serializer=SER.identifier,
)


@dataclass(frozen=True)
class Code:
    """The code a restore runs: the backend classes and ``restore_table`` (a
    planted copy of one of them: tests/test_spec_catches_bad_checks.py)."""

    heap: type[HeapKeyedStateBackend] = HeapKeyedStateBackend
    rocksdb: type[RocksDBKeyedStateBackend] = RocksDBKeyedStateBackend
    restore_table: Callable[..., int] = restore_table

    @staticmethod
    def with_planted(planted: Any) -> Code:
        """This code with ``planted`` (a backend class or ``restore_table``) in its place."""
        if isinstance(planted, type) and issubclass(planted, HeapKeyedStateBackend):
            return Code(heap=planted)
        if isinstance(planted, type) and issubclass(planted, RocksDBKeyedStateBackend):
            return Code(rocksdb=planted)
        assert planted.__name__ == "restore_table", planted
        return Code(restore_table=planted)


REAL = Code()

#: An offending entry, of the key group of its block, given the entry it is
#: placed before (the last entry when placed last).
Offence = Callable[[int, Entry], Entry]


@functools.cache
def key_of_group(kg: int, kind: type = int) -> Any:
    """A key of ``kind`` (int or float) in key group ``kg`` that no good entry has."""
    candidates = (i + 0.5 if kind is float else i for i in range(1000, 100_000))
    key: Any = next(k for k in candidates if group_of(k) == kg)
    return key


def foreign_key(kg: int) -> int:
    """A key of another key group than ``kg`` that no good entry has."""
    key: int = key_of_group((kg + 5) % MAX_P)
    return key


def placed(position: str, offence: Offence, entries: list[Entry] | None = None) -> bytes:
    """The control file (or ``entries``) with ``offence``'s entry inserted at
    ``position`` in its block, every CRC valid."""
    blocks = by_group(good_entries() if entries is None else entries)
    kg = LAST if position == "last-block" else INNER
    rows = blocks[kg]
    index = {"first": 0, "middle": len(rows) // 2}.get(position, len(rows))
    rows.insert(index, offence(kg, rows[min(index, len(rows) - 1)]))
    return crafted(blocks, state=LIST_META if entries is not None else STATE_META)


def restore_through(
    path: str, code: Code, state: StateMetadata = STATE_META, targets: Targets | None = None
) -> Callable[[bytes, Path], None]:
    """A restore of one file into a target holding state that a refusal must
    leave as it was: ``path`` is "heap" or "rocksdb" (``restore_from`` of a
    canonical savepoint; the target one of ``targets``, if given) or
    "restore_table" (a table of its own)."""

    def restore(data: bytes, tmp: Path) -> None:
        if path == "restore_table":
            meta = StateMetaInfo(state.name, state.kind, SER, SER)
            table: CopyOnWriteStateTable[Any, Any, Any] = CopyOnWriteStateTable(
                FULL, MAX_P, meta=meta, key_serializer=SER
            )
            table.put(100, "a", ["mine"])
            try:
                code.restore_table(table, [data])
            finally:
                assert {(e.key, e.namespace): e.state for e in table} == {(100, "a"): ["mine"]}
            return
        registered: list[Registered] = (
            [ListStateDescriptor(state.name, serializer=SER)] if state.kind == "list" else []
        )
        handle = handle_for(tmp / "sp" / "file", data, backend=path, state=state)
        if path == "heap":
            backend = heap(cls=code.heap)
            for descriptor in registered:
                backend.get_state(descriptor)
            _into(backend, lambda: backend.restore_from([handle], ABSOLUTE))
            return
        target, local = shared_or_fresh(targets, tmp, FULL, code.rocksdb, registered)
        _into(target, lambda: target.restore_from([handle], ABSOLUTE), shared=bool(targets))
        assert staged_databases(local) == 1, "a refused restore left a database behind"

    return restore


def refused_wherever(
    path: str,
    position: str,
    offence: Offence,
    error: type[CowStateError],
    says: Callable[[int, Entry], tuple[str, ...]],
    tmp: Path,
    code: Code,
    targets: Targets | None,
    entries: list[Entry] | None = None,
) -> None:
    """``offence``'s entry at ``position`` is refused by ``path`` with ``error``
    whose message holds ``says(key group, entry)``; nothing is restored."""
    kg = LAST if position == "last-block" else INNER
    offending: list[Entry] = []

    def noted(kg: int, neighbour: Entry) -> Entry:
        offending.append(offence(kg, neighbour))
        return offending[0]

    data = placed(position, noted, entries)
    state = STATE_META if entries is None else LIST_META
    restore = restore_through(path, code, state, targets)
    refused(restore, data, tmp, error, *says(kg, offending[0]), state=state.name)


def shared_or_fresh(
    targets: Targets | None,
    tmp: Path,
    key_group_range: KeyGroupRange,
    cls: type[RocksDBKeyedStateBackend],
    states: Sequence[Registered] = (),
) -> tuple[RocksDBKeyedStateBackend, Path]:
    """A RocksDB target of ``targets`` (or a new one under ``tmp``, which
    :func:`_into` fills) and its local directory."""
    if targets is not None:
        return targets.get(key_group_range, cls, states)
    backend = rocks(tmp / "local", key_group_range, cls)
    for descriptor in states:
        backend.get_state(descriptor)
    return backend, tmp / "local"


def e1_case(
    role: str,
    path: str,
    position: str,
    tmp: Path,
    code: Code = REAL,
    targets: Targets | None = None,
) -> None:
    offences: dict[str, Offence] = {
        "key": lambda kg, _: (None, "c", "x"),
        "namespace": lambda kg, _: (key_of_group(kg), None, "x"),
        "state": lambda kg, _: (key_of_group(kg), "c", None),
    }
    refused_wherever(
        path,
        position,
        offences[role],
        SnapshotEntryError,
        lambda kg, _: (f"key group {kg}", f"whose {role} is None"),
        tmp,
        code,
        targets,
    )


def e2_case(
    role: str,
    path: str,
    position: str,
    tmp: Path,
    code: Code = REAL,
    targets: Targets | None = None,
) -> None:
    offences: dict[str, Offence] = {
        "key": lambda kg, _: ([1, 2], "c", "x"),
        "namespace": lambda kg, _: (key_of_group(kg), [1, 2], "x"),
    }
    refused_wherever(
        path,
        position,
        offences[role],
        SnapshotEntryError,
        lambda kg, _: (f"key group {kg}", f"expected hashable {role}s", "list [1, 2]"),
        tmp,
        code,
        targets,
    )


def e3_case(
    path: str, position: str, tmp: Path, code: Code = REAL, targets: Targets | None = None
) -> None:
    refused_wherever(
        path,
        position,
        lambda kg, _: (foreign_key(kg), "c", "planted"),
        KeyGroupMismatchError,
        lambda kg, entry: (
            f"key group {kg}",
            f"key {entry[0]!r} there, whose key group is {group_of(entry[0])}",
        ),
        tmp,
        code,
        targets,
    )


def e4_case(
    path: str, position: str, tmp: Path, code: Code = REAL, targets: Targets | None = None
) -> None:
    refused_wherever(
        path,
        position,
        lambda kg, neighbour: (neighbour[0], neighbour[1], "again"),
        DuplicateMappingError,
        lambda kg, entry: (f"({entry[0]!r}, {entry[1]!r}) twice in key group {kg}",),
        tmp,
        code,
        targets,
    )


def e5_case(
    path: str, position: str, tmp: Path, code: Code = REAL, targets: Targets | None = None
) -> None:
    refused_wherever(
        path,
        position,
        lambda kg, _: (key_of_group(kg), "c", 7),
        SnapshotEntryError,
        lambda kg, _: (f"key group {kg} to be a list", "got a state of type int"),
        tmp,
        code,
        targets,
        entries=[(k, ns, [s]) for k, ns, s in good_entries()],
    )


def e6_case(
    path: str, position: str, tmp: Path, code: Code = REAL, targets: Targets | None = None
) -> None:
    """A float key among the int keys (the target's type; a table's numbers)."""
    refused_wherever(
        path,
        position,
        lambda kg, _: (key_of_group(kg, float), "c", "x"),
        MixedKeyTypesError,
        lambda kg, entry: (f"key group {kg} has float {entry[0]!r}",),
        tmp,
        code,
        targets,
    )


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Targets]:
    shared = Targets(tmp_path_factory.mktemp("targets"))
    yield shared
    shared.close()


BACKEND_PATHS = pytest.mark.parametrize("path", ["heap", "rocksdb"])
TABLE_PATHS = pytest.mark.parametrize("path", ["heap", "rocksdb", "restore_table"])
AT_EVERY_POSITION = pytest.mark.parametrize("position", POSITIONS)


@AT_EVERY_POSITION
@pytest.mark.parametrize(
    ("role", "path"),
    [
        ("key", "heap"),
        ("namespace", "heap"),
        ("state", "heap"),
        ("namespace", "rocksdb"),
        ("state", "rocksdb"),  # a None key: the same line as a None state
    ],
)
def test_e1_refuses_a_none_key_namespace_or_state_wherever_it_stands(
    role: str, path: str, position: str, tmp_path: Path, targets: Targets
) -> None:
    e1_case(role, path, position, tmp_path, targets=targets)


@AT_EVERY_POSITION
@pytest.mark.parametrize("role", ["key", "namespace"])
def test_e2_refuses_an_unhashable_key_or_namespace_wherever_it_stands(
    role: str, position: str, tmp_path: Path
) -> None:
    """The heap restore; RocksDB's hashes a key in E3's call and a namespace in
    the namespace decoding of E1's (both tested above and below)."""
    e2_case(role, "heap", position, tmp_path)


@AT_EVERY_POSITION
@BACKEND_PATHS
def test_e3_refuses_a_key_of_another_key_group_wherever_it_stands(
    path: str, position: str, tmp_path: Path, targets: Targets
) -> None:
    e3_case(path, position, tmp_path, targets=targets)


@AT_EVERY_POSITION
@TABLE_PATHS
def test_e4_refuses_a_mapping_given_twice_wherever_it_stands(
    path: str, position: str, tmp_path: Path, targets: Targets
) -> None:
    """The mapping repeated is the block's first (entries 0 and 1), a middle one,
    its last (the last two entries), the last block's last."""
    e4_case(path, position, tmp_path, targets=targets)


@AT_EVERY_POSITION
@BACKEND_PATHS
def test_e5_refuses_a_state_its_kind_does_not_hold_wherever_it_stands(
    path: str, position: str, tmp_path: Path, targets: Targets
) -> None:
    e5_case(path, position, tmp_path, targets=targets)


@AT_EVERY_POSITION
@TABLE_PATHS
def test_e6_refuses_a_key_of_another_type_wherever_it_stands(
    path: str, position: str, tmp_path: Path, targets: Targets
) -> None:
    e6_case(path, position, tmp_path, targets=targets)


# RocksDB native files: a rescaling restore copies the entries of the handles
# it does not keep, each checked on the way (E1-E3, E5, E6 of every row of a
# key group, Restorer._check_stored). The offending entry stands first, in the
# middle and last in RocksDB's order (by key group, key length, key bytes) of
# the block of key group NATIVE_INNER and last in the last block copied: a
# None state replaces the state of the good entry there (E1: the rows a
# block's check is handed), or a key of another key group is placed there
# (E3: the keys it checks); its key bytes are the shortest pickle of the key,
# padded (unpickling ignores what follows), to sort where it must among the
# good keys, whose pickles are 15 and 17 bytes long.

#: Keys pickled in 15 bytes (up to 65535) and 17 (beyond): an entry can sort
#: before, among and after them.
NATIVE_KEYS = [*range(256, 296), *range(65536, 65576)]
LOW, HIGH = KeyGroupRange(0, 7), KeyGroupRange(8, 15)
NATIVE_INNER = 11


@pytest.fixture(scope="module")
def low_half(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeyedStateHandle, Path]:
    return low_half_in(tmp_path_factory.mktemp("native"))


def low_half_in(root: Path) -> tuple[KeyedStateHandle, Path]:
    """A native checkpoint of key groups 0-7 (kept as it is by the rescaling
    restores below) and its job directory (copied beside each case's files)."""

    def build() -> tuple[KeyedStateHandle, Path]:
        handle, _ = native_snapshot(root, LOW, keys=NATIVE_KEYS)
        return handle, root / "job"

    return built_once("low half", build)


def good_rocks_keys(kg: int) -> list[bytes]:
    """The RocksDB keys of :func:`native_snapshot` of NATIVE_KEYS in key group ``kg``, in order."""
    return sorted(
        encode_rocks_key(kg, pickle.dumps(k), pickle.dumps("a"))
        for k in NATIVE_KEYS
        if group_of(k) == kg
    )


def rocks_key_at(position: str, kg: int, key: Any) -> bytes:
    """A RocksDB key of ``key`` (namespace "c") in key group ``kg`` that sorts at
    ``position`` among :func:`good_rocks_keys`."""
    good = good_rocks_keys(kg)
    shortest = pickletools.optimize(pickle.dumps(key, protocol=0))
    for pad in range(64):
        rocks_key = encode_rocks_key(kg, shortest + b"\0" * pad, pickle.dumps("c"))
        rank = bisect.bisect(good, rocks_key)
        if {"first": rank == 0, "middle": 0 < rank < len(good)}.get(position, rank == len(good)):
            return rocks_key
    raise AssertionError(f"no padding puts {key!r} {position} in key group {kg}")


def native_case(
    check: str,
    position: str,
    tmp: Path,
    low_half: tuple[KeyedStateHandle, Path],
    code: Code = REAL,
    targets: Targets | None = None,
) -> None:
    kg = LAST if position == "last-block" else NATIVE_INNER
    says: tuple[str, ...]
    error: type[CowStateError]
    if check == "E1":
        good = good_rocks_keys(kg)
        rocks_key = good[{"first": 0, "middle": len(good) // 2}.get(position, -1)]
        value, error = pickle.dumps(None), SnapshotEntryError
        says = (f"key group {kg}", "whose state is None")
    else:
        key = foreign_key(kg)
        rocks_key, value = rocks_key_at(position, kg, key), pickle.dumps("x")
        error = KeyGroupMismatchError
        says = (f"key group {kg}", f"key {key!r} there, whose key group is {group_of(key)}")

    def plant(backend: RocksDBKeyedStateBackend) -> None:
        backend.table("value")._column().put(rocks_key, value)

    high, source = built_once(
        ("rescaled", check, position),
        lambda: native_snapshot(tmp, HIGH, keys=NATIVE_KEYS, plant=plant, beside=low_half[1]),
    )
    target, local = shared_or_fresh(targets, tmp, FULL, code.rocksdb)

    def restore(data: bytes, tmp: Path) -> None:
        restore_from = target.restore_from
        _into(target, lambda: restore_from([low_half[0], high], source), shared=bool(targets))
        assert staged_databases(local) == 1, "a refused restore left a database behind"

    refused(restore, b"", tmp, error, *says)


@AT_EVERY_POSITION
@pytest.mark.parametrize("check", ["E1", "E3"])
def test_a_rescaling_restore_refuses_a_bad_entry_it_copies_wherever_it_stands(
    check: str,
    position: str,
    tmp_path: Path,
    low_half: tuple[KeyedStateHandle, Path],
    targets: Targets,
) -> None:
    native_case(check, position, tmp_path, low_half, targets=targets)


#: The states of the native restore kept as it is, one column family each.
COLUMN_STATES = ("s0", "s1", "s2")


def e6_native_case(
    position: str, tmp: Path, code: Code = REAL, targets: Targets | None = None
) -> None:
    """A native restore of the same key groups keeps the files as they are and
    decodes the first key of each column family only (E6: the key type): a
    float key first in the first, the middle or the last column family of a
    database of int keys is refused."""
    name = COLUMN_STATES[{"first": 0, "middle": 1}.get(position, 2)]
    key = key_of_group(0, float)
    rocks_key = encode_rocks_key(
        0, pickletools.optimize(pickle.dumps(key, protocol=0)), pickle.dumps("c")
    )
    assert rocks_key < min(good_rocks_keys(0))  # the column family's first key

    def plant(backend: RocksDBKeyedStateBackend) -> None:
        backend.table(name)._column().put(rocks_key, pickle.dumps("x"))

    handle, source = built_once(
        ("first keys", position),
        lambda: native_snapshot(tmp, states=COLUMN_STATES, keys=NATIVE_KEYS, plant=plant),
    )
    states: list[Registered] = [
        ValueStateDescriptor(state, serializer=SER) for state in COLUMN_STATES
    ]
    target, local = shared_or_fresh(targets, tmp, FULL, code.rocksdb, states)

    def restore(data: bytes, tmp: Path) -> None:
        _into(target, lambda: target.restore_from([handle], source), shared=bool(targets))
        assert staged_databases(local) == 1, "a refused restore left a database behind"

    refused(
        restore,
        b"",
        tmp,
        MixedKeyTypesError,
        f"key group 0 has float {key!r}",
        state=f"state.{name}",
    )


@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_e6_a_native_restore_refuses_a_first_key_of_another_type_in_any_column_family(
    position: str, tmp_path: Path, targets: Targets
) -> None:
    e6_native_case(position, tmp_path, targets=targets)
