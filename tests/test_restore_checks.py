"""The semantic checks of snapshot contents (cowstate.snapshot.checks, E1-E4):
files crafted with the real writer's building blocks -- every CRC, the index
and the metadata valid -- whose entries no table can keep are refused by every
restore path with a precise error naming the state, the key group and what was
wrong, and nothing is restored.

Each crafted case is also shown to be harmful: with the check switched off
(a deliberately broken restore) the same file restores wrong data.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from restore_support import (
    FULL,
    MAX_P,
    SER,
    VALUE,
    Contents,
    Entry,
    by_group,
    crafted,
    crafted_raw,
    dump,
    fill,
    group_of,
    handle_for,
    heap,
    metadata_of,
    raw_blocks,
    rocks,
)
from test_key_groups import VECTORS, key_of

from cowstate import errors
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.errors import (
    CowStateError,
    DuplicateMappingError,
    KeyGroupMismatchError,
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


def _into(backend: AbstractKeyedStateBackend[Any], restore: Callable[[], None]) -> Contents:
    fill(backend, range(100, 130), tag="mine")
    before = dump(backend)
    try:
        restore()
    finally:
        after = dump(backend)
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


def staged_databases(local: Path) -> int:
    """Databases in the instance directories under ``local`` (live ones included)."""
    return sum(1 for p in local.glob("cowstate-rocksdb-*/db-*") if p.is_dir())


def rewritten_as(data: bytes, snapshot_format: SnapshotFormat) -> bytes:
    """The same raw entries in a file of another format."""
    return crafted_raw(raw_blocks(data), snapshot_format=snapshot_format)


def refused(
    restore: Restore, data: bytes, tmp: Path, error: type[CowStateError], *fragments: str
) -> None:
    with pytest.raises(error) as excinfo:
        restore(data, tmp)
    message = str(excinfo.value)
    assert type(excinfo.value) is error, repr(excinfo.value)
    for fragment in ("expected", "'value'", *fragments):
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
            checked += 1
    assert checked > 100


@pytest.mark.skipif(_keygroups is None, reason="cowstate._keygroups did not build")
def test_the_c_key_groups_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_parallelism"):
        _keygroups.key_groups([1], 0, False)
    with pytest.raises(TypeError):
        _keygroups.key_groups(5, 128, False)  # type: ignore[arg-type]


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
