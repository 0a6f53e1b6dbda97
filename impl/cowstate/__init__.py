"""cowstate: Flink's heap keyed state -- the copy-on-write state map, key
groups, state tables, snapshot files and the keyed state backend -- in Python.

>>> from cowstate import CopyOnWriteStateMap
>>> m = CopyOnWriteStateMap()
>>> m.put("alice", "window-1", [1])
>>> with m.snapshot() as snap:
...     m.get("alice", "window-1").append(2)   # copy-on-write: snap keeps [1]
...     [tuple(e) for e in snap]
[('alice', 'window-1', [1])]
>>> m.get("alice", "window-1")
[1, 2]
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

from cowstate import descriptors
from cowstate.descriptors import *  # noqa: F403 (every state kind's descriptor and handle)
from cowstate.errors import (
    BackendClosedError,
    BadMagicError,
    CheckpointError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    ConcurrentModificationError,
    CorruptCheckpointError,
    CowStateError,
    ForeignSnapshotError,
    IncompatibleSnapshotError,
    InconsistentMetadataError,
    InvalidArgumentError,
    KeyComparisonError,
    KeyGroupMismatchError,
    KeyGroupOutOfRangeError,
    KeyHashError,
    MaximumCapacityError,
    MaxParallelismMismatchError,
    MetadataChecksumError,
    NoCurrentKeyError,
    NoneStateError,
    SerializerMismatchError,
    SnapshotCancelledError,
    SnapshotFormatError,
    SnapshotReleasedError,
    SnapshotWriteError,
    StateCopyError,
    StateRegistrationError,
    StateTooDeepError,
    TransformFunctionError,
    TruncatedSnapshotError,
    UndecodableValueError,
    UnhashableKeyError,
    UnknownCheckpointError,
    UnknownStateError,
    UnsafePathError,
    UnsupportedMetadataVersionError,
    UnsupportedValueError,
    UnsupportedVersionError,
    UntrustedSerializerError,
    VersionOverflowError,
)
from cowstate.heap_backend import HeapKeyedStateBackend, KeyedStateSnapshotResult, SnapshotFuture
from cowstate.heap_incremental import IncrementalOptions
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
    compute_operator_index_for_key_group,
)
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.map_contract import StateEntry
from cowstate.maps import IMPLEMENTATION, CopyOnWriteStateMap, StateMapSnapshot
from cowstate.nested_table import NestedMapsStateTable
from cowstate.serializers import (
    DefaultSerializer,
    ImmutablePickleSerializer,
    ImmutableSerializer,
    IntSerializer,
    LongSerializer,
    PickleSerializer,
    StateSerializer,
    StringSerializer,
)
from cowstate.snapshot import read_snapshot, restore_table, write_snapshot
from cowstate.state_meta import StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, StateTableSnapshot

try:  # one source: the version in pyproject.toml
    __version__ = _distribution_version("cowstate")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

__all__ = [
    "IMPLEMENTATION",
    "VOID_NAMESPACE",
    "BackendClosedError",
    "BadMagicError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ChecksumMismatchError",
    "ConcurrentModificationError",
    "CopyOnWriteStateMap",
    "CopyOnWriteStateTable",
    "CorruptCheckpointError",
    "CowStateError",
    "DefaultSerializer",
    "ForeignSnapshotError",
    "HeapKeyedStateBackend",
    "ImmutablePickleSerializer",
    "ImmutableSerializer",
    "IncompatibleSnapshotError",
    "InconsistentMetadataError",
    "IncrementalOptions",
    "IntSerializer",
    "InvalidArgumentError",
    "KeyComparisonError",
    "KeyGroupMismatchError",
    "KeyGroupOutOfRangeError",
    "KeyGroupRange",
    "KeyHashError",
    "KeyedStateSnapshotResult",
    "LongSerializer",
    "MaxParallelismMismatchError",
    "MaximumCapacityError",
    "MetadataChecksumError",
    "NestedMapsStateTable",
    "NoCurrentKeyError",
    "NoneStateError",
    "PickleSerializer",
    "SerializerMismatchError",
    "SnapshotCancelledError",
    "SnapshotFormatError",
    "SnapshotFuture",
    "SnapshotReleasedError",
    "SnapshotWriteError",
    "StateCopyError",
    "StateEntry",
    "StateMapSnapshot",
    "StateMetaInfo",
    "StateRegistrationError",
    "StateSerializer",
    "StateTableSnapshot",
    "StateTooDeepError",
    "StringSerializer",
    "TransformFunctionError",
    "TruncatedSnapshotError",
    "UndecodableValueError",
    "UnhashableKeyError",
    "UnknownCheckpointError",
    "UnknownStateError",
    "UnsafePathError",
    "UnsupportedMetadataVersionError",
    "UnsupportedValueError",
    "UnsupportedVersionError",
    "UntrustedSerializerError",
    "VersionOverflowError",
    "assign_to_key_group",
    "compute_key_group_range_for_operator_index",
    "compute_operator_index_for_key_group",
    "read_snapshot",
    "restore_table",
    "write_snapshot",
]
__all__ += descriptors.__all__  # every state kind's descriptor and handle
