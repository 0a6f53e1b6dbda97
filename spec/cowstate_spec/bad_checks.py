"""Deliberately broken restore checks: a content check that samples, a set
check that counts.

Two classes of defect pass every state machine, because a machine's snapshots
are written by the real writer and hold no bad entry for a check to miss:

- a *sampled* content check: a check of the entries of a block (E1-E6 of
  :mod:`cowstate.snapshot.checks`), of the column families of a RocksDB
  database (N2, and E6 of a native restore) or of the subtasks and files of a
  ``_metadata`` document (M3-M9 of :mod:`cowstate.checkpoint.verify`) that
  looks at the first item only (or the first two, where one alone can never
  fail);
- a *counted* set check: two sets compared by their sizes instead of their
  members (N1, N3 of :mod:`cowstate.rocksdb.restore`, the states and key
  groups a file holds against its handle, the cover of the key groups by the
  subtasks of M4, the disowned files of M8), and the coordinator's own
  subtasks compared as neighbours across an empty range (the defect its
  ``_check_backends`` had: the count of key groups then hid an overlap).

Each :class:`CheckBug` is one :class:`~cowstate_spec.bad_layers.FunctionBug`
or :class:`~cowstate_spec.bad_implementations.Bug` (one rewritten line, or a
few) and the callers through which the broken function reaches a restore;
:func:`planted` recompiles each caller from its own unchanged source with the
broken callee in its globals (:func:`~cowstate_spec.bad_layers.rebound`,
:func:`~cowstate_spec.bad_implementations.broken_class`): the outermost is a
backend class, ``restore_table`` or ``CheckpointCoordinator``, a private copy
(nothing in ``cowstate`` is patched).

They are caught by the tests that put the offending item at the first, a
middle and the last position and in the last block, or that give a set the
same size and another member (``tests/test_restore_checks.py``,
``tests/test_restore_trust.py``, ``tests/test_checkpoint_rules.py``):
``tests/test_spec_catches_bad_checks.py`` runs each such test through the
planted copy and requires it to fail at exactly the positions
:attr:`CheckBug.escapes` names (a position, a "same count" case) and pass at
the others; where a defect fails at every position, its identity control
(:func:`control`: the same callers rebound, the line unchanged) must pass.

The RocksDB bugs are :func:`rocksdb_check_bugs` (``cowstate.rocksdb`` needs
the optional ``rocksdict``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cowstate.checkpoint import coordinator, storage, verify
from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.snapshot import checks, reader
from cowstate.snapshot import restore as snapshot_restore
from cowstate.snapshot.checks import EntryDecoder
from cowstate.snapshot.reader import SnapshotReader
from cowstate_spec.bad_implementations import Bug, broken_class
from cowstate_spec.bad_layers import FunctionBug, LayerBug, broken_function, identity, rebound

__all__ = [
    "CHECK_BUGS",
    "Caller",
    "CheckBug",
    "control",
    "planted",
    "rocksdb_check_bugs",
]

#: A caller through which a broken function or class reaches a restore: a
#: function (recompiled with the broken callee in its globals), or a class and
#: the name of its method that calls it (a subclass with that method recompiled).
Caller = Callable[..., Any] | tuple[type[Any], str]


@dataclass(frozen=True)
class CheckBug:
    """A restore check (``check``: "E3", "N1", "M7", ...) broken by ``bug``,
    reaching a restore through ``callers`` (innermost first); the positions
    whose test must fail on it are ``escapes`` (every other one still
    refused: the defect samples, and the oracle sees where)."""

    check: str
    bug: LayerBug
    callers: tuple[Caller, ...]
    escapes: frozenset[str]
    #: The check lives in the Python loop the C codec's loop replaces for
    #: built-in deserializers (cowstate.snapshot.ccodec): its test runs with
    #: the C codec off, as under COWSTATE_PURE_PYTHON=1 or for a serializer of
    #: the user's; the C loop's copy has its own planted bug (bad_codecs).
    python_path: bool = False

    @property
    def name(self) -> str:
        return self.bug.name


def planted(check_bug: CheckBug) -> Any:
    """The outermost of ``check_bug.callers`` with the bug planted (the broken
    function or class itself if there are none): each caller a private copy,
    recompiled from its own source with the broken callee under the callee's
    own name."""
    bug = check_bug.bug
    broken: Any
    if isinstance(bug, FunctionBug):
        broken, name = broken_function(bug), bug.function.__name__
    else:
        broken, name = broken_class(bug), bug.cls.__name__
    for caller in check_bug.callers:
        if isinstance(caller, tuple):
            cls, method = caller
            head = f"def {method}("
            rebind = Bug(f"rebound-{method}", method, head, head, "rebound", cls)
            broken, name = broken_class(rebind, **{name: broken}), cls.__name__
        else:
            broken, name = rebound(caller, **{name: broken}), caller.__name__
    return broken


def control(check_bug: CheckBug) -> CheckBug:
    """The identity control of ``check_bug``: the same callers rebound, the line
    unchanged; nothing escapes."""
    return replace(check_bug, bug=identity(check_bug.bug), escapes=frozenset())


_LATER = frozenset({"middle", "last", "last-block"})
_EVERYWHERE = frozenset({"first", "middle", "last", "last-block"})
_LAST = frozenset({"last"})

# The chains from a snapshot check to a heap backend: _decode -> read_snapshot
# -> HeapKeyedStateBackend._decode_and_fill (prepare_restore and restore call it,
# through _prepare).
_HEAP_DECODE: tuple[Caller, ...] = (
    snapshot_restore._decode,
    snapshot_restore.read_snapshot,
    (HeapKeyedStateBackend, "_decode_and_fill"),
)
# ... and from a document check to a restore of a checkpoint.
_RESTORE_DOCUMENT: tuple[Caller, ...] = (
    verify.parse_metadata,
    storage.read_metadata,
    (CheckpointCoordinator, "restore"),
)

#: The broken snapshot checks (heap path, restore_table) and document checks.
CHECK_BUGS: list[CheckBug] = [
    CheckBug(
        "E1",
        FunctionBug(
            "e1-decoding-loop-checks-the-first-entry-only",
            reader._decoded_section,
            "if key is None or state is None:",
            "if (key is None or state is None) and not keys:",
            "E1: every decoded key and state of a block is checked for None",
        ),
        ((SnapshotReader, "_parse_payload"), (HeapKeyedStateBackend, "prepare_restore")),
        _LATER,
        python_path=True,
    ),
    CheckBug(
        "E1",
        Bug(
            "e1-namespace-check-of-the-first-namespace-only",
            "decode_namespace",
            "if namespace is None:",
            "if namespace is None and not self.namespaces:",
            "E1: every distinct namespace is checked for None, not the first a decoder meets",
            EntryDecoder,
        ),
        _HEAP_DECODE,
        _EVERYWHERE,  # the blocks before hold namespaces: the decoder met one
    ),
    CheckBug(
        "E2",
        Bug(
            "e2-namespace-hash-of-the-first-namespace-only",
            "decode_namespace",
            "        hash(namespace)\n",
            "        hash(namespace) if not self.namespaces else None\n",
            "E2: every distinct namespace must hash, not the first a decoder meets",
            EntryDecoder,
        ),
        _HEAP_DECODE,
        _EVERYWHERE,
    ),
    CheckBug(
        "E3",
        FunctionBug(
            "e3-key-group-check-of-the-first-key-only",
            checks.check_key_groups,
            "count = len(keys)",
            "count = min(len(keys), 1)",
            "E2, E3: every key of a block hashes and belongs to the block's key group",
        ),
        _HEAP_DECODE,
        _LATER,
    ),
    CheckBug(
        "E4",
        Bug(
            "e4-heap-fill-checks-the-first-two-entries-only",
            "_filled_table",
            "if not put(key, namespace, state):",
            "if not put(key, namespace, state) and len(table.state_map(key_group)) < 2:",
            "E4: every put of a restored block says whether its mapping was new",
            HeapKeyedStateBackend,
        ),
        (),
        _LATER,
    ),
    CheckBug(
        "E4",
        FunctionBug(
            "e4-find-duplicate-remembers-the-first-entry-only",
            checks.find_duplicate,
            "        seen.add(pair)",
            "        seen.add(pair) if not seen else None",
            "E4: restore_table compares every mapping of a block with every other",
        ),
        (snapshot_restore.restore_table,),
        _LATER,
    ),
    CheckBug(
        "E5",
        FunctionBug(
            "e5-state-type-of-the-first-state-only",
            checks.check_state_types,
            "for kind in set(map(type, states)):",
            "for kind in set(map(type, states[:1])):",
            "E5: every state of a list or map state's block is what its kind holds",
        ),
        _HEAP_DECODE,
        _LATER,
    ),
    CheckBug(
        "E6",
        FunctionBug(
            "e6-key-type-of-the-first-key-only",
            checks.check_key_types,
            "for key in keys[:1] if plain else keys:",
            "for key in keys[:1]:",
            "E6: every key of a block of mixed types is admitted, not its first",
        ),
        ((HeapKeyedStateBackend, "_decode_and_fill"),),
        _LATER,
    ),
    CheckBug(
        "M3",
        FunctionBug(
            "m3-job-id-of-the-first-character-only",
            verify._check_identity,
            "if not _JOB_ID.match(metadata.job_id):",
            "if not _JOB_ID.match(metadata.job_id[:1]):",
            "M3: every character of the job id is a letter, digit, '.', '_' or '-'",
        ),
        (verify.verify_metadata, *_RESTORE_DOCUMENT),
        frozenset({"middle", "last"}),
    ),
    CheckBug(
        "M4",
        FunctionBug(
            "m4-max-parallelism-of-the-first-subtask-only",
            verify._check_key_groups,
            "if handle.max_parallelism != max_parallelism:",
            "if index == 0 and handle.max_parallelism != max_parallelism:",
            "M4: every subtask has the document's max parallelism",
        ),
        (verify.verify_metadata, *_RESTORE_DOCUMENT),
        frozenset({"middle", "last"}),
    ),
    CheckBug(
        "M4",
        FunctionBug(
            "m4-range-bounds-of-the-first-subtask-only",
            verify._check_key_groups,
            "if not 0 <= start <= end + 1 <= max_parallelism:",
            "if index == 0 and not 0 <= start <= end + 1 <= max_parallelism:",
            "M4: every subtask's range lies inside [0, max parallelism - 1]",
        ),
        (verify.verify_metadata, *_RESTORE_DOCUMENT),
        frozenset({"middle", "last"}),
    ),
    CheckBug(
        "M4",
        FunctionBug(
            "m4-empty-range-of-the-first-subtask-only",
            verify._check_key_groups,
            "elif handle.states or handle.files:",
            "elif index == 0 and (handle.states or handle.files):",
            "M4: every subtask without key groups lists no state and no file",
        ),
        (verify.verify_metadata, *_RESTORE_DOCUMENT),
        frozenset({"middle", "last"}),
    ),
    CheckBug(
        "M4",
        FunctionBug(
            "m4-cover-by-count",
            verify._check_key_groups,
            "        if start != expected:\n"
            "            what = "
            '"overlaps" if start < expected else f"leaves key groups {expected}..{start - 1}"\n'
            "            raise InconsistentMetadataError(\n"
            '                f"expected the subtasks of {where} to split '
            '[0, {max_parallelism - 1}] into "\n'
            '                f"disjoint ranges, subtask {index}\'s [{start}, {end}] {what}"\n'
            "            )\n"
            "        expected = end + 1\n",
            "        expected += end - start + 1\n",
            "M4: the subtasks' ranges are disjoint and cover every key group, which their "
            "sizes adding up to the max parallelism does not say",
        ),
        (verify.verify_metadata, *_RESTORE_DOCUMENT),
        frozenset({"same count"}),
    ),
    CheckBug(
        "M5",
        FunctionBug(
            "m5-m7-verify-the-first-subtask-only",
            verify.verify_metadata,
            "for index, handle in enumerate(metadata.subtasks):",
            "for index, handle in enumerate(metadata.subtasks[:1]):",
            "M5-M7: every subtask's handle and files are checked",
        ),
        _RESTORE_DOCUMENT,
        frozenset({"middle", "last"}),
    ),
    CheckBug(
        "M6",
        FunctionBug(
            "m6-m7-verify-the-first-file-only",
            verify.verify_metadata,
            "for f in handle.files:",
            "for f in handle.files[:1]:",
            "M6, M7: every file of a subtask is checked",
        ),
        _RESTORE_DOCUMENT,
        _LATER,
    ),
    CheckBug(
        "M8",
        FunctionBug(
            "m8-the-first-disowned-file-only",
            verify.verify_metadata,
            "stray = sorted(set(metadata.disowned) - shared)",
            "stray = sorted(set(metadata.disowned[:1]) - shared)",
            "M8: every disowned path is a shared file of the document",
        ),
        _RESTORE_DOCUMENT,
        frozenset({"middle", "last"}),
    ),
    CheckBug(
        "M8",
        FunctionBug(
            "m8-disowned-by-count",
            verify.verify_metadata,
            "stray = sorted(set(metadata.disowned) - shared)",
            "stray = [] if len(set(metadata.disowned)) <= len(shared) else sorted(shared)",
            "M8: the disowned paths are shared files of the document, which there being no "
            "more of them than shared files does not say",
        ),
        _RESTORE_DOCUMENT,
        frozenset({"same count"}),
    ),
    CheckBug(
        "M9",
        FunctionBug(
            "m9-key-serializers-of-the-first-two-subtasks-only",
            verify._check_schema,
            "{handle.key_serializer for handle in metadata.subtasks}",
            "{handle.key_serializer for handle in metadata.subtasks[:2]}",
            "M9: every subtask names the same key serializer",
        ),
        (verify.verify_metadata, *_RESTORE_DOCUMENT),
        _LAST,
    ),
    CheckBug(
        "M9",
        FunctionBug(
            "m9-state-schemas-of-the-first-two-subtasks-only",
            verify._check_schema,
            "for index, handle in enumerate(metadata.subtasks):",
            "for index, handle in enumerate(metadata.subtasks[:2]):",
            "M9: a state has one kind and serializers in every subtask",
        ),
        (verify.verify_metadata, *_RESTORE_DOCUMENT),
        _LAST,
    ),
    CheckBug(
        "subtasks",
        FunctionBug(
            "subtask-ranges-compared-across-an-empty-range",
            coordinator._check_backends,
            "owned = [r for r in ranges if len(r)]",
            "owned = ranges",
            "a coordinator's subtasks hold every key group once: an empty range, which "
            "sorts anywhere, parts no two neighbours (the count of key groups then hid an "
            "overlap; fixed)",
        ),
        ((CheckpointCoordinator, "__init__"),),
        frozenset({"beside-an-empty-range"}),
    ),
    CheckBug(
        "files",
        Bug(
            "file-states-by-count",
            "_check_file_of",
            "if tuple(metadata.states) != tuple(handle.states):",
            "if len(metadata.states) != len(handle.states):",
            "a snapshot file holds the states its handle lists, not as many",
            HeapKeyedStateBackend,
        ),
        (),
        frozenset({"same count"}),
    ),
    CheckBug(
        "files",
        Bug(
            "file-key-groups-by-count",
            "_check_file_of",
            "if expected != got:",
            "if (expected[0][1] - expected[0][0], *expected[1:]) != "
            "(got[0][1] - got[0][0], *got[1:]):",
            "a snapshot file holds its handle's key groups, not as many",
            HeapKeyedStateBackend,
        ),
        (),
        frozenset({"same count"}),
    ),
]


def rocksdb_check_bugs() -> list[CheckBug]:
    """The broken checks of the RocksDB restore (E1, E4, E6 and the native
    copy's checks; N1-N3); ``cowstate.rocksdb`` is imported here (rocksdict)."""
    from cowstate.rocksdb import restore as rocks_restore
    from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
    from cowstate.rocksdb.restore import Restorer

    prepare = (RocksDBKeyedStateBackend, "prepare_restore")
    native: tuple[Caller, ...] = (
        rocks_restore.check_native,
        (Restorer, "from_native"),
        prepare,
    )
    return [
        CheckBug(
            "E1",
            FunctionBug(
                "e1-row-decoding-checks-the-first-entry-only",
                checks.decode_rows,
                "if key is None or state is None:",
                "if (key is None or state is None) and not keys:",
                "E1: every row a RocksDB restore decodes is checked for None",
            ),
            ((Restorer, "_checked"), prepare),
            _LATER,
        ),
        CheckBug(
            "E4",
            Bug(
                "e4-rocksdb-compares-with-the-first-key-only",
                "_checked",
                "if rocks_key in seen:",
                "if rocks_key in seen and rocks_key == rocks_keys[0]:",
                "E4: every RocksDB key of a canonical block is compared with every other",
                Restorer,
            ),
            (prepare,),
            _LATER,
        ),
        CheckBug(
            "native",
            Bug(
                "native-copy-checks-the-first-row-only",
                "_check_stored",
                "for rocks_key, value in rows:",
                "for rocks_key, value in rows[:1]:",
                "E1-E3, E5, E6: every entry a rescaling restore copies is checked",
                Restorer,
            ),
            (prepare,),
            _LATER,
        ),
        CheckBug(
            "E6",
            Bug(
                "e6-native-first-key-of-the-first-column-family-only",
                "_check_first_keys",
                "for name in sorted(built.column_families):",
                "for name in sorted(built.column_families)[:1]:",
                "E6: the first key of every column family a native restore keeps",
                Restorer,
            ),
            (prepare,),
            frozenset({"middle", "last"}),
        ),
        CheckBug(
            "N2",
            FunctionBug(
                "n2-first-column-family-only",
                rocks_restore._check_native,
                "for name in sorted(present):  # N2",
                "for name in sorted(present)[:1]:  # N2",
                "N2: the keys of every column family lie in the handle's key groups",
            ),
            native,
            _LATER,
        ),
        CheckBug(
            "N2",
            FunctionBug(
                "n2-first-key-only",
                rocks_restore._check_native,
                "if groups[0] not in r or groups[1] not in r:",
                "if groups[0] not in r:",
                "N2: the first and the last key of a column family lie in the handle's "
                "key groups (RocksDB keys sort by key group)",
            ),
            native,
            frozenset({"last-block"}),
        ),
        CheckBug(
            "N1",
            FunctionBug(
                "n1-column-families-by-count",
                rocks_restore._check_native,
                "if present != named:  # N1",
                "if len(present) != len(named):  # N1",
                "N1: the column families are those of the handle's states, not as many",
            ),
            native,
            frozenset({"same count"}),
        ),
        CheckBug(
            "N3",
            FunctionBug(
                "n3-native-files-by-count",
                rocks_restore._check_native,
                "if live != listed:  # N3",
                "if len(live) != len(listed):  # N3",
                "N3: the database uses the SST files its handle lists, not as many",
            ),
            native,
            frozenset({"same count"}),
        ),
    ]
