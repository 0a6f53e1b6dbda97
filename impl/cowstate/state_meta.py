"""The state vocabulary of tables, snapshot files, backends and checkpoints:
what a state is, how a snapshot of it is described, and in which format it
was written. (What every map and table says about one mapping -- the entry
record, the transform and keys contracts, the messages -- is one layer
lower, in :mod:`cowstate.map_contract`.)

- :class:`StateKind`: value, list, map, reducing, aggregating -- a state's
  kind (defined beside the descriptors, in :mod:`cowstate.descriptors`;
  every kind's row is in :mod:`cowstate.kinds`; re-exported here).
- :class:`SnapshotFormat`: ``heap`` (a heap backend's snapshot file),
  ``canonical`` (the backend-independent snapshot file any backend restores),
  ``rocksdb-native`` (RocksDB's own files), and the two files of a heap
  incremental checkpoint's delta, ``heap-delta`` and ``heap-removals``.
- :data:`SnapshotTransformer`: rewrites or drops a state in a snapshot only.
- :class:`StateMetaInfo`: one state's name, kind, serializers and
  transformer, the live objects a table works with.
- :class:`StateMetadata`: the same state as recorded -- serializer
  *identifiers* instead of serializers -- in a snapshot file's metadata and in
  a checkpoint's keyed state handle alike.

Tables, snapshot files, both backends and the checkpoint handles import these
from here; nothing here imports a table or a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cowstate.descriptors import StateKind
from cowstate.errors import InvalidArgumentError
from cowstate.serializers import (
    DefaultSerializer,
    StateSerializer,
    duplicate_serializer,
    serializer_identifier,
)

__all__ = [
    "MAX_STATES",
    "STATE_KINDS",
    "SnapshotFormat",
    "SnapshotTransformer",
    "StateKind",
    "StateMetaInfo",
    "StateMetadata",
]

#: Flink's limit on the states of one snapshot: state ids are shorts.
MAX_STATES = (1 << 15) - 1


#: The kinds' names, in declaration order (for messages).
STATE_KINDS: tuple[str, ...] = tuple(kind.value for kind in StateKind)


class SnapshotFormat(StrEnum):
    """What a snapshot's files are, recorded in snapshot files and handles."""

    #: A heap backend's snapshot file (restorable by a heap backend).
    HEAP = "heap"
    #: The backend-independent snapshot file: every backend restores it.
    CANONICAL = "canonical"
    #: RocksDB's own files (SSTs, MANIFEST, ...): only RocksDB restores them.
    ROCKSDB_NATIVE = "rocksdb-native"
    #: A heap incremental checkpoint's file of changed mappings (a file's
    #: format only, never a handle's: :mod:`cowstate.heap_incremental`).
    HEAP_DELTA = "heap-delta"
    #: A heap incremental checkpoint's file of removed keys (likewise).
    HEAP_REMOVALS = "heap-removals"

    def __repr__(self) -> str:
        return repr(self.value)


#: ``transformer(state)``: ``None`` drops the mapping from the snapshot, anything
#: else is written instead of ``state``. Must not mutate ``state``.
SnapshotTransformer = Callable[[Any], Any]


@dataclass(frozen=True)
class StateMetaInfo:
    """What a snapshot file records about one state, and how to (de)serialize it.

    ``kind`` may be given as its string (``"value"``); it is stored as a
    :class:`StateKind`.
    """

    name: str = "state"
    kind: StateKind = StateKind.VALUE
    namespace_serializer: StateSerializer = field(default_factory=DefaultSerializer)
    state_serializer: StateSerializer = field(default_factory=DefaultSerializer)
    snapshot_transformer: SnapshotTransformer | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"expected a non-empty str state name, got {self.name!r}")
        if self.kind not in STATE_KINDS:
            raise InvalidArgumentError(f"expected a state kind in {STATE_KINDS}, got {self.kind!r}")
        object.__setattr__(self, "kind", StateKind(self.kind))
        for role in ("namespace_serializer", "state_serializer"):
            if not isinstance(getattr(self, role), StateSerializer):
                raise InvalidArgumentError(
                    f"expected a {role} with copy/serialize/deserialize, got "
                    f"{type(getattr(self, role)).__name__}"
                )
        if self.snapshot_transformer is not None and not callable(self.snapshot_transformer):
            raise InvalidArgumentError(
                "expected a callable snapshot_transformer or None, got "
                f"{type(self.snapshot_transformer).__name__}"
            )

    def duplicated(self) -> StateMetaInfo:
        """The same meta info with serializers a background writer may own."""
        return replace(
            self,
            namespace_serializer=duplicate_serializer(self.namespace_serializer),
            state_serializer=duplicate_serializer(self.state_serializer),
        )

    def metadata(self, state_id: int) -> StateMetadata:
        """This state as a snapshot records it, with id ``state_id``."""
        return StateMetadata(
            id=state_id,
            name=self.name,
            kind=self.kind,
            namespace_serializer=serializer_identifier(self.namespace_serializer),
            state_serializer=serializer_identifier(self.state_serializer),
        )


class StateMetadata(BaseModel):
    """One state of a snapshot, as its snapshot file and its checkpoint handle
    record it: id (the state's position in the snapshot, registration order),
    name, kind and serializer identifiers."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: int = Field(ge=0, le=MAX_STATES)
    name: str = Field(min_length=1)
    kind: StateKind = Field(strict=False)
    namespace_serializer: str
    state_serializer: str
