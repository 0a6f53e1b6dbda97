"""The snapshot-file fuzzer: real snapshot files, corrupted every way the
format allows, restored into fresh backends and into backends that already
hold state.

Fixtures (:func:`build_file_fixtures`): a heap backend's file over all 16 key
groups, a subtask's file over 8 of them, a heap canonical file, and a RocksDB
backend's canonical savepoint file -- five states of every kind, two
namespaces, ints, strings and tuples as keys.

Corruption classes (:data:`FILE_CLASSES`), each a function of the fixture
and a seeded random generator:

- raw: ``truncate:<region>``, ``bitflip:<region>``, ``byterun:<region>``,
  ``insert:<region>`` for every region of the layout
  (:data:`~cowstate_spec.fuzz.layout.REGION_NAMES`), ``append``, ``splice``;
- crafted, every CRC32 recomputed (:mod:`~cowstate_spec.fuzz.layout`): the
  index pointing at another block, a block moved into another key group's
  slot, an entry moved into a block of another key group, ``None`` as key,
  namespace or state (encoded with the file's serializer), duplicate mappings
  (same and other state), an unhashable key, undecodable bytes, a pickle
  payload that opens the canary, wrong entry counts, unknown or repeated state
  ids, another version or magic, and edited metadata (max parallelism,
  key-group range -- also shifted with every block relabelled --, serializers,
  kinds, state ids and names, format, broken JSON).

Every case restores the corrupt file twice: into a fresh backend (states
registered or not) and into one holding other state, both over one
key-group range (all, the file's, a half); a canonical file goes into a
RocksDB backend in a share of the cases (``rocks_share``), through a handle
whose size and CRC32 match the corrupt bytes -- what a resealed
``_metadata`` would say.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import FileHandle, KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.errors import CowStateError
from cowstate.key_groups import KeyGroupRange
from cowstate.serializers import serializer_for
from cowstate.snapshot import SnapshotMetadata
from cowstate.state_meta import STATE_KINDS, SnapshotFormat
from cowstate_spec.fuzz.jobs import (
    MAX_PARALLELISM,
    STATES,
    Original,
    expected_views,
    fill,
    new_backend,
    original_of,
    prefill,
    subtask_ranges,
)
from cowstate_spec.fuzz.layout import REGION_NAMES, FileImage, Region, Section, parse
from cowstate_spec.fuzz.outcomes import (
    Entry,
    Outcome,
    Verdict,
    View,
    Watch,
    canon,
    classify,
    manifest,
    manifest_changes,
    view_of,
    worst,
)

__all__ = [
    "FILE_CLASSES",
    "FileFixture",
    "FileSuite",
    "Mutation",
    "build_file_fixtures",
    "pickle_payload",
    "run_file_case",
]


@dataclass(frozen=True)
class FileFixture:
    """One real snapshot file, taken apart, and what it holds."""

    name: str
    data: bytes
    image: FileImage
    regions: tuple[Region, ...]
    key_group_range: KeyGroupRange
    original: Original
    metadata: dict[str, Any]

    @property
    def canonical(self) -> bool:
        return bool(self.metadata["format"] == "canonical")


#: An entry relocated by a crafted corruption: (state name, canonical key,
#: namespace and state -- all None: every entry of the key group --, the key
#: group it belongs to, the key group whose block now holds it).
Move = tuple[str | None, str | None, str | None, str | None, int, int]


@dataclass(frozen=True)
class Mutation:
    """A corrupt file and how it was made.

    ``moves``: entries a crafted case put into the block of another key group.
    Such a file (every CRC valid) no longer *claims* those entries for their
    own key groups. A backend whose range reads a block holding a foreign
    entry must refuse (E3); a backend whose range reads none of them restores
    exactly what the file claims for its key groups -- the snapshot's entries
    there, less the ones moved out of its range, which it cannot see: that
    is the right outcome, and the subtask reading the block they went to
    refuses it, so a whole-job restore fails (:func:`claimed_view`).
    """

    data: bytes
    description: str
    moves: tuple[Move, ...] = ()
    #: A state whose serializer id was edited: (name, old id, new id). The file
    #: then claims the states its bytes decode to under the new serializer: a
    #: fresh backend that restores exactly those is right (:func:`reinterpreted_view`).
    reinterpret: tuple[str, str, str] | None = None


@dataclass
class FileSuite:
    """Everything the file cases share: fixtures, the canary, the watch."""

    scratch: str
    fixtures: list[FileFixture]
    watch: Watch
    #: Of the cases of a canonical fixture, the share also restored into RocksDB.
    rocks_share: float = 0.1

    @property
    def canary(self) -> str:
        return os.path.join(self.scratch, "canary")

    @property
    def secret(self) -> str:
        return os.path.join(self.canary, "secret")

    @property
    def rocks_source(self) -> str:
        """Where a corrupt canonical file waits for a RocksDB restore."""
        return os.path.join(self.scratch, "rocks-source")

    @property
    def rocks_local(self) -> str:
        """The RocksDB backends' instance directories."""
        return os.path.join(self.scratch, "rocks-local")


Corruption = Callable[[FileFixture, random.Random, str], Mutation]


def build_file_fixtures(scratch: str) -> FileSuite:
    """Write the fixtures (and the canary) under ``scratch``."""
    os.makedirs(os.path.join(scratch, "canary"), exist_ok=True)
    with open(os.path.join(scratch, "canary", "secret"), "w") as f:
        f.write("do not read")
    fixtures = []
    full = KeyGroupRange(0, MAX_PARALLELISM - 1)
    for name, snapshot_format, round_ in (
        ("heap", SnapshotFormat.HEAP, 1),
        ("heap-canonical", SnapshotFormat.CANONICAL, 3),
    ):
        with new_backend("heap", full) as backend:
            fill([backend], round_)
            future = backend.snapshot(1, io.BytesIO, snapshot_format=snapshot_format)
            fixtures.append(_fixture(name, future.result().handle.getvalue(), [backend]))
    subtasks = [new_backend("heap", r) for r in subtask_ranges(2)]
    fill(subtasks, 2)
    data = subtasks[1].snapshot(1, io.BytesIO).result().handle.getvalue()
    fixtures.append(_fixture("heap-upper", data, subtasks[1:]))
    for backend in subtasks:
        backend.close()
    rocks = new_backend("rocksdb", full, os.path.join(scratch, "rocks-local"))
    try:
        fill([rocks], 4)
        directory = os.path.join(scratch, "rocks-savepoint")
        location = SnapshotLocation(FileSystem(), directory)
        options = SnapshotOptions(kind="savepoint", format="canonical")
        handle = rocks.snapshot_to(1, location, options).result()
        with open(os.path.join(directory, handle.files[0].path), "rb") as f:
            fixtures.append(_fixture("rocksdb-canonical", f.read(), [rocks]))
    finally:
        rocks.close()
    return FileSuite(scratch, fixtures, Watch())


def run_file_case(
    suite: FileSuite, fixture: FileFixture, mutation: Mutation, rng: random.Random
) -> tuple[Verdict, str]:
    """Restore ``mutation`` twice (fresh, then holding state); the verdict and
    where it was restored."""
    lower, upper = subtask_ranges(2)
    ranges = {
        "all": KeyGroupRange(0, MAX_PARALLELISM - 1),
        "file": fixture.key_group_range,
        "lower": lower,
        "upper": upper,
    }
    which = rng.choice(sorted(ranges))
    kind = "rocksdb" if fixture.canonical and rng.random() < suite.rocks_share else "heap"
    first = rng.choice(["fresh", "registered"])
    where = f"{kind} backends over {which} key groups {ranges[which]!r} ({first}, prefilled)"
    before_canary = manifest(suite.canary, lambda p: True)
    suite.watch.reset(suite.scratch, [suite.rocks_source, suite.rocks_local])
    with suite.watch.installed():  # a payload may run in the restore or at the first read
        verdicts = [
            _restore_into(suite, fixture, mutation, kind, ranges[which], state)
            for state in (first, "prefilled")
        ]
    changes = manifest_changes(before_canary, manifest(suite.canary, lambda p: True))
    if suite.watch.reads or changes:
        verdicts.append(Verdict(Outcome.OUTSIDE, "; ".join(suite.watch.reads + changes)[:300]))
        _restore_canary(suite)
    return worst(verdicts), where


def pickle_payload(path: str) -> bytes:
    """Pickle bytes that call ``builtins.open(path)`` when unpickled (protocol
    0, spelled out: ``open.__module__`` is ``io``, and the watch patches
    :func:`builtins.open`)."""
    return b"cbuiltins\nopen\n(V" + path.encode("raw_unicode_escape") + b"\ntR."


# ----------------------------------------------------------- raw corruptions


def _regions(fixture: FileFixture, name: str, rng: random.Random) -> Region:
    candidates = [r for r in fixture.regions if r.name == name and r.end > r.start]
    return rng.choice(candidates)


def _truncate(region: str) -> Corruption:
    def corrupt(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
        r = _regions(fixture, region, rng)
        cut = rng.randrange(r.start, r.end)
        return Mutation(
            fixture.data[:cut],
            f"truncated to {cut} of {len(fixture.data)} bytes, in {r.describe()}",
        )

    return corrupt


def _bitflip(region: str) -> Corruption:
    def corrupt(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
        r = _regions(fixture, region, rng)
        data = bytearray(fixture.data)
        bits = rng.sample(range(r.start * 8, r.end * 8), rng.choice((1, 1, 2, 5)))
        flips = sorted(divmod(bit, 8) for bit in bits)  # distinct: no flip undoes another
        for at, bit in flips:
            data[at] ^= 1 << bit
        shown = ", ".join(f"byte {at} bit {bit}" for at, bit in flips)
        return Mutation(bytes(data), f"flipped {shown} in {r.describe()}")

    return corrupt


def _byterun(region: str) -> Corruption:
    def corrupt(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
        r = _regions(fixture, region, rng)
        at = rng.randrange(r.start, r.end)
        length = min(rng.randint(1, 16), r.end - at)
        pattern = rng.choice(("zeros", "ones", "random"))
        run = {
            "zeros": b"\x00" * length,
            "ones": b"\xff" * length,
            "random": rng.randbytes(length),
        }[pattern]
        if run == fixture.data[at : at + length]:  # never a run the file already holds
            run = bytes([run[0] ^ 0xFF]) + run[1:]
        data = fixture.data[:at] + run + fixture.data[at + length :]
        return Mutation(
            data, f"{length} bytes at {at} overwritten with {pattern} in {r.describe()}"
        )

    return corrupt


def _insert(region: str) -> Corruption:
    def corrupt(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
        r = _regions(fixture, region, rng)
        at = rng.randrange(r.start, r.end)
        extra = rng.randbytes(rng.randint(1, 8))
        data = fixture.data[:at] + extra + fixture.data[at:]
        return Mutation(data, f"{len(extra)} bytes inserted at {at} in {r.describe()}")

    return corrupt


def _append(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    extra = rng.choice((b"\x00", rng.randbytes(rng.randint(1, 64)), fixture.data[-16:]))
    return Mutation(fixture.data + extra, f"{len(extra)} bytes appended")


def _splice(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    cut = rng.randrange(1, len(fixture.data))
    other = rng.randbytes(len(fixture.data) - cut)
    choice = rng.choice(("random tail", "own tail shifted"))
    tail = other if choice == "random tail" else fixture.data[cut - 1 : -1]
    return Mutation(fixture.data[:cut] + tail, f"{choice} spliced in at {cut}")


# ------------------------------------------------------- crafted corruptions


def _pick_entry(image: FileImage, rng: random.Random) -> tuple[int, int, int]:
    """(block, section, entry) positions of a random entry."""
    spots = [
        (b, s, e)
        for b, block in enumerate(image.blocks)
        for s, section in enumerate(block.sections)
        for e in range(len(section.entries))
    ]
    return rng.choice(spots)


def _serializer_bytes(identifier: str, value: Any) -> tuple[bytes, str]:
    """``value`` encoded with the serializer ``identifier`` names (pickled if
    that serializer cannot encode it: then the case says so)."""
    try:
        return serializer_for(identifier).serialize(value), ""
    except Exception as exc:  # a serializer that refuses the value
        return pickle.dumps(
            value
        ), f" (the file's serializer refused it: {type(exc).__name__}; pickled)"


def _state_meta(fixture: FileFixture, state_id: int) -> dict[str, Any]:
    return next(s for s in fixture.metadata["states"] if s["id"] == state_id)


def _index_swap(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    i, j = rng.sample(range(len(image.blocks)), 2)
    index = [(b.key_group, n) for n, b in enumerate(image.blocks)]
    index[i], index[j] = (index[i][0], j), (index[j][0], i)
    image.index = index
    groups = image.blocks[i].key_group, image.blocks[j].key_group
    return Mutation(
        image.encode(), f"index entries of key groups {groups} point at each other's block"
    )


def _block_moved(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    full = [n for n, b in enumerate(image.blocks) if b.sections]
    i = rng.choice(full)
    j = rng.choice([n for n in range(len(image.blocks)) if n != i])
    a, b = image.blocks[i], image.blocks[j]
    a.sections, b.sections = b.sections, a.sections
    return Mutation(
        image.encode(),
        f"the entries of key groups {a.key_group} and {b.key_group} swapped blocks "
        "(headers, index and CRCs consistent)",
        (
            (None, None, None, None, a.key_group, b.key_group),
            (None, None, None, None, b.key_group, a.key_group),
        ),
    )


def _foreign_key(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    b, s, e = _pick_entry(image, rng)
    source = image.blocks[b]
    section = source.sections[s]
    entry = section.entries.pop(e)
    if not section.entries:
        source.sections.pop(s)
    target = rng.choice([blk for n, blk in enumerate(image.blocks) if n != b])
    into = next((x for x in target.sections if x.state_id == section.state_id), None)
    if into is None:
        into = Section(section.state_id, [])
        target.sections.append(into)
        target.sections.sort(key=lambda x: x.state_id)
    into.entries.append(entry)
    meta = _state_meta(fixture, section.state_id)
    identifiers = (
        meta["namespace_serializer"],
        fixture.metadata["key_serializer"],
        meta["state_serializer"],
    )
    namespace, key, state = (
        canon(serializer_for(identifier).deserialize(raw))
        for identifier, raw in zip(identifiers, entry, strict=True)
    )
    return Mutation(
        image.encode(),
        f"an entry of state id {section.state_id} moved from key group {source.key_group} "
        f"into the block of key group {target.key_group}",
        ((meta["name"], key, namespace, state, source.key_group, target.key_group),),
    )


def _none_field(role: int) -> Corruption:
    names = ("namespace", "key", "state")

    def corrupt(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
        image = fixture.image.copy()
        b, s, e = _pick_entry(image, rng)
        section = image.blocks[b].sections[s]
        meta = _state_meta(fixture, section.state_id)
        identifier = (
            meta["namespace_serializer"],
            fixture.metadata["key_serializer"],
            meta["state_serializer"],
        )[role]
        encoded, note = _serializer_bytes(identifier, None)
        fields = list(section.entries[e])
        fields[role] = encoded
        section.entries[e] = (fields[0], fields[1], fields[2])
        return Mutation(
            image.encode(),
            f"the {names[role]} of an entry of state {meta['name']!r} in key group "
            f"{image.blocks[b].key_group} is None{note}",
        )

    return corrupt


def _duplicate(other_state: bool) -> Corruption:
    def corrupt(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
        image = fixture.image.copy()
        b, s, e = _pick_entry(image, rng)
        section = image.blocks[b].sections[s]
        namespace, key, state = section.entries[e]
        what = "the same state"
        if other_state:
            others = [
                x[2]
                for blk in image.blocks
                for sec in blk.sections
                if sec.state_id == section.state_id
                for x in sec.entries
                if x[2] != state
            ]
            if others:
                state, what = rng.choice(others), "another state"
        section.entries.append((namespace, key, state))
        return Mutation(
            image.encode(),
            f"an entry of state id {section.state_id} in key group "
            f"{image.blocks[b].key_group} repeated with {what}",
        )

    return corrupt


def _unhashable_key(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    b, s, e = _pick_entry(image, rng)
    section = image.blocks[b].sections[s]
    value = rng.choice(([1, 2], {"a": 1}, {3}))
    encoded, note = _serializer_bytes(fixture.metadata["key_serializer"], value)
    namespace, _key, state = section.entries[e]
    section.entries[e] = (namespace, encoded, state)
    return Mutation(
        image.encode(),
        f"the key of an entry in key group {image.blocks[b].key_group} is {value!r}{note}",
    )


def _undecodable(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    b, s, e = _pick_entry(image, rng)
    section = image.blocks[b].sections[s]
    role = rng.randrange(3)
    fields = list(section.entries[e])
    fields[role] = rng.randbytes(rng.randint(0, 12))
    section.entries[e] = (fields[0], fields[1], fields[2])
    return Mutation(
        image.encode(),
        f"the {('namespace', 'key', 'state')[role]} of an entry in key group "
        f"{image.blocks[b].key_group} is {len(fields[role])} random bytes",
    )


def _pickle_payload(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    b, s, e = _pick_entry(image, rng)
    section = image.blocks[b].sections[s]
    role = rng.randrange(3)
    fields = list(section.entries[e])
    fields[role] = pickle_payload(os.path.join(canary, "secret"))
    section.entries[e] = (fields[0], fields[1], fields[2])
    return Mutation(
        image.encode(),
        f"the {('namespace', 'key', 'state')[role]} of an entry in key group "
        f"{image.blocks[b].key_group} is a pickle payload opening the canary",
    )


def _count_mismatch(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    b, s, _e = _pick_entry(image, rng)
    block = image.blocks[b]
    delta = rng.choice((-1, 1, 1000))
    if rng.random() < 0.5:
        block.count = max(0, block.entry_count() + delta)
        what = f"the block's entry count {block.entry_count()} -> {block.count}"
    else:
        section = block.sections[s]
        section.count = max(0, len(section.entries) + delta)
        what = (
            f"state id {section.state_id}'s entry count {len(section.entries)} -> {section.count}"
        )
    return Mutation(image.encode(), f"{what} in key group {block.key_group}")


def _state_id(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    b, s, _e = _pick_entry(image, rng)
    block = image.blocks[b]
    section = block.sections[s]
    # An unknown id, or the id of another section of the same block (a state
    # twice); never another state's id absent here: that is a valid file.
    ids = [x["id"] for x in fixture.metadata["states"]]
    present = [x.state_id for x in block.sections if x is not section]
    new = rng.choice([max(ids) + 1, 65535, *present])
    old, section.state_id = section.state_id, new
    return Mutation(
        image.encode(), f"state id {old} -> {new} in the block of key group {block.key_group}"
    )


def _version(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
    image = fixture.image.copy()
    if rng.random() < 0.5:
        image.version = rng.choice((0, 2, 255, 65535))
        what = f"format version {image.version}"
    else:
        image.magic = rng.choice((b"\x89CWSNAP\r", b"\x00" * 8, b"PK\x03\x04\x14\x00\x00\x00"))
        what = f"magic {image.magic!r}"
    return Mutation(image.encode(), what + " (header CRC valid)")


# ------------------------------------------------------------ metadata edits

#: Hostile values for metadata fields.
_JUNK: tuple[Any, ...] = (None, -1, 0, 1, 2**15, 2**63, "", "x" * 300, [], {}, 1.5, True)


def _meta_edit(field: str) -> Corruption:
    def corrupt(fixture: FileFixture, rng: random.Random, canary: str) -> Mutation:
        image = fixture.image.copy()
        document = json.loads(fixture.image.metadata)
        states = document["states"]
        state = rng.choice(states)
        reinterpret: tuple[str, str, str] | None = None
        if field == "max-parallelism":
            value = rng.choice((8, 32, 1, 2**15, *_JUNK))
            document["max_parallelism"] = value
            what = f"max_parallelism {value!r}"
        elif field == "range":
            return _meta_range(fixture, image, document, rng)
        elif field in ("key-serializer", "namespace-serializer", "state-serializer"):
            # Not BytesSerializer for states: it decodes any bytes, so the file
            # would be valid (states of another type), not corrupt.
            value = rng.choice(
                (
                    "int32",
                    "int64",
                    "utf8",
                    "pickle-immutable",
                    "builtins.eval",
                    *_JUNK,
                    *(("bytes",) if field != "state-serializer" else ()),
                )
            )
            if field == "key-serializer":
                document["key_serializer"] = value
            else:
                if field == "state-serializer" and isinstance(value, str):
                    reinterpret = (state["name"], state["state_serializer"], value)
                state[field.replace("-", "_")] = value
            what = f"{field} {value!r}"
        elif field == "kind":
            value = rng.choice((*STATE_KINDS, "weird", *_JUNK))
            state["kind"] = value
            what = f"kind of {state['name']!r} {value!r}"
        elif field == "state-id":
            others = [s["id"] for s in states if s is not state]
            value = rng.choice((*others, -1, 2**15, 2**16, "0", None))
            state["id"] = value
            what = f"id of {state['name']!r} {value!r}"
        elif field == "state-name":
            others = [s["name"] for s in states if s is not state]
            value = rng.choice((*others, "", None, 7))
            state["name"] = value
            what = f"name of state id {state['id']} {value!r}"
        elif field == "format":
            value = rng.choice(("rocksdb-native", "heap", "canonical", "weird", *_JUNK))
            document["format"] = value
            what = f"format {value!r}"
        else:  # "json"
            return _meta_json(image, document, rng)
        image.metadata = json.dumps(document).encode()
        return Mutation(image.encode(), f"metadata {what} (re-CRC'd)", reinterpret=reinterpret)

    return corrupt


def _meta_range(
    fixture: FileFixture, image: FileImage, document: dict[str, Any], rng: random.Random
) -> Mutation:
    start, end = document["key_group_range"]
    if rng.random() < 0.5:
        # Shift the range and relabel every block: a consistent file whose
        # entries all sit one key group off (a full range loses its last block).
        shift = -1 if start > 0 else 1
        if end + shift >= MAX_PARALLELISM:
            image.blocks.pop()
            end -= 1
        document["key_group_range"] = [start + shift, end + shift]
        for block in image.blocks:
            block.key_group += shift
        image.metadata = json.dumps(document).encode()
        return Mutation(
            image.encode(),
            f"metadata range -> {document['key_group_range']} with every block relabelled "
            f"by {shift:+d} (re-CRC'd)",
        )
    value = rng.choice(
        ([start, end - 1], [start + 1, end], [0, MAX_PARALLELISM], [end, start], [-1, end], [5])
    )
    document["key_group_range"] = value
    image.metadata = json.dumps(document).encode()
    return Mutation(image.encode(), f"metadata range [{start}, {end}] -> {value} (re-CRC'd)")


def _meta_json(image: FileImage, document: dict[str, Any], rng: random.Random) -> Mutation:
    choice = rng.randrange(7)
    if choice == 0:
        raw, what = json.dumps(document).encode()[:-1], "JSON cut short"
    elif choice == 1:
        document["extra"] = 1
        raw, what = json.dumps(document).encode(), "an unknown field"
    elif choice == 2:
        field = rng.choice(sorted(document))
        del document[field]
        raw, what = json.dumps(document).encode(), f"field {field!r} missing"
    elif choice == 3:
        raw, what = rng.choice((b"[]", b"null", b"0", b'""', b"{}")), "another JSON value"
    elif choice == 4:
        raw, what = b"[" * 100_000 + b"]" * 100_000, "deeply nested JSON"
    elif choice == 5:
        raw, what = b"\xff\xfe" + json.dumps(document).encode(), "not UTF-8"
    else:
        document["states"] = document["states"] * 2
        raw, what = json.dumps(document).encode(), "every state listed twice"
    image.metadata = raw
    return Mutation(image.encode(), f"metadata: {what} (re-CRC'd)")


def _file_classes() -> dict[str, Corruption]:
    classes: dict[str, Corruption] = {}
    for region in REGION_NAMES:
        classes[f"truncate:{region}"] = _truncate(region)
    for region in REGION_NAMES:
        classes[f"bitflip:{region}"] = _bitflip(region)
    for region in REGION_NAMES:
        classes[f"byterun:{region}"] = _byterun(region)
    for region in REGION_NAMES:
        classes[f"insert:{region}"] = _insert(region)
    classes["append"] = _append
    classes["splice"] = _splice
    classes["crafted:index-swap"] = _index_swap
    classes["crafted:block-moved"] = _block_moved
    classes["crafted:foreign-key"] = _foreign_key
    classes["crafted:none-namespace"] = _none_field(0)
    classes["crafted:none-key"] = _none_field(1)
    classes["crafted:none-state"] = _none_field(2)
    classes["crafted:duplicate-same"] = _duplicate(False)
    classes["crafted:duplicate-other"] = _duplicate(True)
    classes["crafted:unhashable-key"] = _unhashable_key
    classes["crafted:undecodable"] = _undecodable
    classes["crafted:pickle-payload"] = _pickle_payload
    classes["crafted:count-mismatch"] = _count_mismatch
    classes["crafted:state-id"] = _state_id
    classes["crafted:version-magic"] = _version
    for field in (
        "max-parallelism",
        "range",
        "key-serializer",
        "namespace-serializer",
        "state-serializer",
        "kind",
        "state-id",
        "state-name",
        "format",
        "json",
    ):
        classes[f"crafted:meta-{field}"] = _meta_edit(field)
    return classes


#: Every corruption class of snapshot files, by name.
FILE_CLASSES: dict[str, Corruption] = _file_classes()


# ------------------------------------------------------------ private helpers


def _fixture(name: str, data: bytes, backends: list[Any]) -> FileFixture:
    image, regions = parse(data)
    metadata = json.loads(image.metadata)
    start, end = metadata["key_group_range"]
    return FileFixture(
        name,
        data,
        image,
        tuple(regions),
        KeyGroupRange(start, end),
        original_of(backends),
        metadata,
    )


def claimed_view(
    fixture: FileFixture, moves: tuple[Move, ...], key_group_range: KeyGroupRange
) -> View | None:
    """What a file with ``moves`` claims for ``key_group_range`` (see
    :class:`Mutation`): None if a block of the range holds a moved entry (only
    a refusal is right), else the snapshot's view of the range without the
    entries moved out of it."""
    view = expected_views(fixture.original, [key_group_range])[0]
    groups = {
        (name, canon(key), canon(namespace), canon(state)): group
        for name, group, key, namespace, state in fixture.original
    }
    gone: set[Entry] = set()
    for name, key, namespace, state, home, block in moves:
        if name is None:
            moved = {entry for entry, group in groups.items() if group == home}
        else:
            assert key is not None and namespace is not None and state is not None
            moved = {(name, key, namespace, state)}
        if not moved or home == block:
            continue
        if block in key_group_range:
            return None
        if home in key_group_range:
            gone |= moved
    return tuple(entry for entry in view if entry not in gone)


def reinterpreted_view(
    fixture: FileFixture, reinterpret: tuple[str, str, str], key_group_range: KeyGroupRange
) -> View | None:
    """What a file whose state ``name`` was re-labelled from serializer ``old``
    to ``new`` claims for ``key_group_range``: every state of it there decoded
    from its bytes with ``new`` (None if one does not decode to a state)."""
    name, old, new = reinterpret
    try:
        encode, decode = serializer_for(old).serialize, serializer_for(new).deserialize
    except CowStateError:
        return None
    entries = []
    for state_name, group, key, namespace, state in fixture.original:
        if state_name == name and group in key_group_range:
            try:
                state = decode(encode(state))
            except Exception:
                return None
            if state is None:
                return None
        entries.append((state_name, group, key, namespace, state))
    return expected_views(tuple(entries), [key_group_range])[0]


def _restore_into(
    suite: FileSuite,
    fixture: FileFixture,
    mutation: Mutation,
    kind: str,
    key_group_range: KeyGroupRange,
    state: str,
) -> Verdict:
    """Restore ``mutation`` into one new ``kind`` backend in ``state`` (fresh,
    registered, prefilled) and classify it against the fixture's contents (or,
    for entries moved out of the range, what the file claims)."""
    data = mutation.data
    backend = new_backend(kind, key_group_range, suite.rocks_local)
    close_error: BaseException | None = None
    try:
        if state != "fresh":
            for descriptor in STATES:
                backend.get_state(descriptor)
        if state == "prefilled":
            prefill(backend)
        before = [view_of(backend)]
        error: BaseException | None = None
        try:
            if kind == "heap":
                backend.restore([data])
            else:
                handle, source = _rocks_handle(suite, fixture, data)
                backend.restore_from([handle], source)
        except Exception as exc:
            error = exc
        after: list[Any] | BaseException
        try:
            after = [view_of(backend)]
        except Exception as exc:
            after = exc
        expected = [expected_views(fixture.original, [key_group_range])]
        if mutation.moves:
            claimed = claimed_view(fixture, mutation.moves, key_group_range)
            expected = [] if claimed is None else [[claimed]]
        if mutation.reinterpret is not None:
            view = reinterpreted_view(fixture, mutation.reinterpret, key_group_range)
            expected += [] if view is None else [[view]]
        verdict = classify(error, before, after, expected)
    finally:
        try:
            backend.close()
        except Exception as exc:
            close_error = exc
    if close_error is not None and not isinstance(close_error, CowStateError):
        return worst([verdict, Verdict(Outcome.ESCAPED, f"close: {close_error!r}"[:200])])
    return verdict


def _rocks_handle(
    suite: FileSuite, fixture: FileFixture, data: bytes
) -> tuple[KeyedStateHandle, SnapshotSource]:
    """The corrupt file as a canonical savepoint's handle would list it: the
    original states and range, the corrupt bytes' size and CRC32."""
    os.makedirs(suite.rocks_source, exist_ok=True)
    with open(os.path.join(suite.rocks_source, "keyed-state"), "wb") as f:
        f.write(data)
    metadata = SnapshotMetadata.model_validate_json(fixture.image.metadata)
    r = fixture.key_group_range
    handle = KeyedStateHandle(
        backend="rocksdb",
        format=SnapshotFormat.CANONICAL,
        key_group_range=(r.start_key_group, r.end_key_group),
        max_parallelism=MAX_PARALLELISM,
        checkpoint_id=1,
        key_serializer=metadata.key_serializer,
        states=metadata.states,
        files=(
            FileHandle(
                path="keyed-state", size=len(data), crc32=zlib.crc32(data), scope="exclusive"
            ),
        ),
        checkpointed_size=len(data),
        full_size=len(data),
    )
    return handle, SnapshotSource(FileSystem(), suite.rocks_source)


def _restore_canary(suite: FileSuite) -> None:
    shutil.rmtree(suite.canary, ignore_errors=True)
    os.makedirs(suite.canary)
    with open(suite.secret, "w") as f:
        f.write("do not read")
