"""What every keyed state backend shares: the key context, state registration,
and the state handles, over one table per state (Flink's
``AbstractKeyedStateBackend``).

A backend holds the key groups of one :class:`~cowstate.key_groups.KeyGroupRange`
of ``max_parallelism``. Each state registered through a descriptor gets a
table from ``_new_table``; keyed states read and write it at the current key
and namespace. A name registered again must describe the same state (same
kind, serializer of the same identifier). Subclasses decide what a table is
(objects on the heap, bytes in RocksDB) and how snapshots and restores work.

Restores are two-phase (:mod:`cowstate.checkpoint.protocol`): a subclass's
``prepare_restore`` verifies and stages everything and returns a
:class:`StagedRestore` whose ``commit()`` swaps it in; ``restore_from`` is
both. The checks every backend makes on the handles it is given live here:
the compatibility rules (C1-C6 of :mod:`cowstate.snapshot.compat`: max
parallelism, key and namespace serializers, kinds and state serializers of
known states, formats), each key group in one handle only
(:meth:`AbstractKeyedStateBackend._handles_to_read`), and each snapshot file
holding what its handle says (:meth:`AbstractKeyedStateBackend._check_file_of`).

One key type per backend (:mod:`cowstate.key_types`, as Flink's typed key
serializer): the first ``set_current_key`` -- or the keys of the first restore
that brings any -- fixes it, every table of the backend shares it, and a
restore's keys must be of it (E6 of :mod:`cowstate.snapshot.checks`; checked
on a copy, adopted when the restore commits).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, ClassVar, Generic, TypeVar, cast

from cowstate.checkpoint.handles import BackendName, KeyedStateHandle, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.protocol import overlapping
from cowstate.descriptors import Describes, StateDescriptor
from cowstate.errors import (
    BackendClosedError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    SnapshotCancelledError,
    SnapshotFormatError,
    SnapshotWriteError,
    StateRegistrationError,
    UnknownStateError,
)
from cowstate.key_groups import KeyGroupRange, check_key_group_range
from cowstate.key_types import KeyTypes
from cowstate.keyed_state import KeyContext, KeyedState, StateHolder, key_group_of
from cowstate.kinds import KINDS
from cowstate.map_contract import StateEntry
from cowstate.protocols import KeyedTable
from cowstate.serializers import (
    DefaultSerializer,
    StateSerializer,
    serializer_for,
    serializer_identifier,
)
from cowstate.snapshot.compat import (
    check_handle_format,
    check_key_serializer,
    check_kind,
    check_max_parallelism,
    check_namespace_serializer,
    check_serializer,
)
from cowstate.snapshot.format import SnapshotMetadata
from cowstate.state_meta import SnapshotFormat, StateKind, StateMetadata, StateMetaInfo
from cowstate.table_base import TableBase

__all__ = ["AbstractKeyedStateBackend", "SnapshotFuture", "StagedRestore"]

T = TypeVar("T")
R = TypeVar("R")
#: The handle class of a descriptor (``get_state``'s result).
H = TypeVar("H", bound=KeyedState)
#: The table type of a backend.
TableT = TypeVar("TableT", bound="KeyedTable[Any, Any, Any]")


class SnapshotFuture(Future[T]):
    """The asynchronous part of a backend's snapshot.

    ``cancel()`` before the writer starts cancels it outright; while it runs,
    the writer stops at its next step (key group, file) and ``result()``
    raises :class:`~cowstate.errors.SnapshotCancelledError` (a
    ``CancelledError``). Either way the snapshot's resources are released.

    No executor runs this future (the writer thread runs the backend's
    ``_run_async``, which calls :meth:`start`), so a cancel notifies its
    waiters itself: ``concurrent.futures.wait()`` and ``as_completed()``
    count a cancelled future as done only once notified, and would otherwise
    wait for the writer thread to reach it -- or out their whole timeout.
    """

    def __init__(self, checkpoint_id: int, release: Callable[[], None]) -> None:
        super().__init__()
        self.checkpoint_id = checkpoint_id
        self.cancel_requested = threading.Event()
        self._release_resources = release
        #: Makes cancel-and-notify and start one step each, never both
        #: (reentrant: a done-callback run by ``cancel`` may cancel again).
        self._starting = threading.RLock()

    def cancel(self) -> bool:
        self.cancel_requested.set()
        with self._starting:
            if self.cancelled():  # cancelled and notified before
                return True
            cancelled = super().cancel()
            if cancelled:
                self.set_running_or_notify_cancel()
        if cancelled:
            self._release_resources()
            return True
        return not self.done()

    def start(self) -> bool:
        """The writer begins (True), unless the future was cancelled first (False)."""
        with self._starting:
            return not self.cancelled() and self.set_running_or_notify_cancel()


class StagedRestore(ABC):
    """A restore a backend verified and staged (a
    :class:`~cowstate.checkpoint.protocol.PreparedRestore`): ``commit()`` once,
    or ``discard()``. Committing a used one raises
    :class:`~cowstate.errors.InvalidArgumentError`; committing into a backend
    closed meanwhile raises :class:`~cowstate.errors.BackendClosedError` and
    discards. A state registered between the prepare and the commit must be
    what the staged restore holds under its name (its kind and serializer),
    as it would have had to be at the prepare: otherwise the commit raises
    :class:`~cowstate.errors.StateRegistrationError` and discards."""

    def __init__(
        self,
        backend: AbstractKeyedStateBackend[Any],
        key_types: KeyTypes | None = None,
        metas: dict[str, StateMetaInfo] | None = None,
    ) -> None:
        self._backend = backend
        self._status = "prepared"
        #: The meta info of the states the staged restore holds, by name.
        self._metas: dict[str, StateMetaInfo] = {} if metas is None else metas
        #: The key type the restored keys fixed or matched (K4 of
        #: :mod:`cowstate.key_types`), the backend's from the commit on.
        self._key_types = key_types

    @property
    def status(self) -> str:
        """``prepared``, ``committed`` or ``discarded``."""
        return self._status

    def commit(self) -> None:
        """Swap the staged state into the backend (in memory; no new checks)."""
        if self._status != "prepared":
            raise InvalidArgumentError(
                f"expected a prepared restore to commit, got one already {self._status}"
            )
        if self._backend._closed:
            self.discard()
            raise BackendClosedError(
                "expected an open backend to commit the restore into, got one that was closed"
            )
        try:
            self._backend._check_registered_since(self._metas)
        except StateRegistrationError:
            self.discard()
            raise
        self._status = "committed"
        if self._key_types is not None:
            self._backend._context.key_types.adopt(self._key_types)
        self._apply()

    def discard(self) -> None:
        """Drop the staged state; the backend stays as it was."""
        if self._status == "prepared":
            self._status = "discarded"
            self._drop()

    @abstractmethod
    def _apply(self) -> None:
        """Swap the staged state in; must not fail on prepared data."""

    @abstractmethod
    def _drop(self) -> None:
        """Release what the staging holds (memory, staged files)."""


class AbstractKeyedStateBackend(ABC, Generic[TableT]):
    """Keyed state for the key groups of ``key_group_range``; see the module doc."""

    #: The ``backend`` of this backend's handles, and the format of its own
    #: snapshots (besides canonical ones, the only format it restores).
    backend_name: ClassVar[BackendName]
    native_format: ClassVar[SnapshotFormat]

    def __init__(
        self,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        *,
        key_serializer: StateSerializer | None = None,
        namespace_serializer: StateSerializer | None = None,
        executor: Executor | None = None,
        writer_thread_name: str = "cowstate-snapshot",
    ) -> None:
        check_key_group_range(key_group_range, max_parallelism)
        if executor is not None and not isinstance(executor, Executor):
            raise InvalidArgumentError(
                f"expected a concurrent.futures.Executor or None, got {type(executor).__name__}"
            )
        self._key_serializer: StateSerializer = key_serializer or DefaultSerializer()
        self._namespace_serializer: StateSerializer = namespace_serializer or DefaultSerializer()
        self._context = KeyContext(key_group_range, max_parallelism, self._key_serializer)
        self._holders: dict[str, StateHolder[TableT]] = {}
        self._closed = False
        # The asynchronous parts: one writer thread (or the given executor), and
        # the snapshots it has not finished, shared with it under the lock.
        self._lock = threading.Lock()
        self._pending: set[SnapshotFuture[Any]] = set()
        self._own_executor = executor is None
        self._executor: Executor = executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=writer_thread_name
        )

    # ------------------------------------------------------------ key context

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._context.key_group_range

    @property
    def max_parallelism(self) -> int:
        return self._context.max_parallelism

    @property
    def key_serializer(self) -> StateSerializer:
        return self._key_serializer

    @property
    def namespace_serializer(self) -> StateSerializer:
        return self._namespace_serializer

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` current (its key group must be in this backend's range).

        D1 of :mod:`cowstate.keyed_state`: a key of the backend's plain key type
        is hashed in C and checked once; every other key takes the context's
        checked path (``KeyContext.set_key``)."""
        c = self._context
        if type(key) in c.key_types.plain:
            key_group = key_group_of(key, c.max_parallelism, c.long_keys)
            index = key_group - c.first_key_group
            if 0 <= index < c.key_group_count:  # C's -1 (hashed in Python) is below too
                c.raw_key = key
                c.key_group = key_group
                c.index = index
                return
        c.set_key(key)

    @property
    def current_key(self) -> Any:
        return self._context.key

    @property
    def current_key_group(self) -> int:
        _ = self._context.key  # NoCurrentKeyError before a key
        return self._context.key_group

    def set_current_namespace(self, namespace: Any) -> None:
        self._context.set_namespace(namespace)

    @property
    def current_namespace(self) -> Any:
        return self._context.namespace

    # ----------------------------------------------------------------- states

    def get_state(self, descriptor: Describes[H]) -> H:
        """The state ``descriptor`` names, registered on first use.

        Another descriptor of the same name must have the same kind and a
        serializer of the same identifier (:class:`StateRegistrationError`).
        """
        if (
            not isinstance(descriptor, StateDescriptor)
            or (kind := KINDS.get(descriptor.kind)) is None
        ):
            raise InvalidArgumentError(
                f"expected a state descriptor, got {type(descriptor).__name__}"
            )
        holder = self._holders.get(descriptor.name)
        if holder is None:
            meta = self._meta_for(descriptor)
            holder = StateHolder(
                descriptor,
                self._share_key_types(self._new_table(meta)),
                self._context,
            )
            self._holders[descriptor.name] = holder
        else:
            self._check_same_state(holder, descriptor)
            if holder.descriptor is None:  # restored, registered only now
                holder.table.set_meta_info(self._meta_for(descriptor))
            holder.descriptor = descriptor
        # The row's handle is the descriptor class's (tests/test_state_kinds.py),
        # which is what Describes[H] typed the call with.
        return cast(H, kind.handle(self._context, holder))

    @property
    def state_names(self) -> list[str]:
        """Registered and restored states, in registration order (their state ids)."""
        return list(self._holders)

    def table(self, name: str) -> TableT:
        """The table of state ``name`` (for inspection, restore and tests)."""
        return self._holder(name).table

    def get_keys(self, name: str, namespace: Any) -> list[Any]:
        """The keys with state ``name`` in ``namespace`` (a list: safe to change state
        while walking it)."""
        return list(self._holder(name).table.keys(namespace))

    def num_state_entries(self) -> int:
        """Mappings over all states."""
        return sum(len(h.table) for h in self._holders.values())

    def entries(self, name: str) -> Iterator[StateEntry[Any, Any, Any]]:
        """Every ``(key, namespace, state)`` of state ``name``, in key-group order."""
        return iter(self._holder(name).table)

    @property
    def pending_snapshots(self) -> int:
        """Snapshots whose asynchronous part has not finished."""
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Stop pending snapshots, wait for the writer, then release what the
        backend holds (:meth:`_release_resources`); idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            future.cancel()
        if self._own_executor:
            self._executor.shutdown(wait=True)
        else:
            wait_futures(pending)
        self._release_resources()

    def __enter__(self) -> AbstractKeyedStateBackend[TableT]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.key_group_range!r} of {self.max_parallelism}, "
            f"states {self.state_names}>"
        )

    # ------------------------------------------------ checkpoints and restores

    @abstractmethod
    def snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> Future[KeyedStateHandle]:
        """Take the synchronous part of a snapshot now; the future writes the rest
        into ``location`` on the writer thread and gives its handle (see
        :mod:`cowstate.checkpoint.protocol`)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is confirmed; nothing to do for a backend
        whose snapshots never build on earlier ones (the heap's)."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete; nothing to do for a
        backend whose snapshots never build on earlier ones (the heap's)."""

    @abstractmethod
    def prepare_restore(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> StagedRestore:
        """Read, verify and stage a restore from ``handles`` of one snapshot without
        changing the backend; ``commit()`` applies it (see
        :mod:`cowstate.checkpoint.protocol`)."""

    def restore_from(
        self,
        handles: Sequence[KeyedStateHandle],
        source: SnapshotSource,
        *,
        incremental_base: bool = False,
    ) -> None:
        """``prepare_restore(handles, source, ...).commit()``: nothing changes unless
        everything verified."""
        self.prepare_restore(handles, source, incremental_base=incremental_base).commit()

    # -------------------------------------------------------- for subclasses

    def _check_snapshot_to(
        self, checkpoint_id: int, location: SnapshotLocation, options: SnapshotOptions
    ) -> None:
        """The arguments of ``snapshot_to``, on an open backend, or a refusal."""
        self._check_open()
        self._check_checkpoint_id(checkpoint_id)
        if not isinstance(location, SnapshotLocation):
            raise InvalidArgumentError(
                f"expected a SnapshotLocation, got {type(location).__name__}"
            )
        if not isinstance(options, SnapshotOptions):
            raise InvalidArgumentError(f"expected SnapshotOptions, got {type(options).__name__}")

    @staticmethod
    def _check_checkpoint_id(checkpoint_id: int) -> None:
        if type(checkpoint_id) is not int or checkpoint_id < 0:
            raise InvalidArgumentError(f"expected a checkpoint id >= 0, got {checkpoint_id!r}")

    # ------------------------------------------------- restore compatibility

    def _handles_to_read(
        self, handles: Sequence[KeyedStateHandle], source: SnapshotSource
    ) -> list[KeyedStateHandle]:
        """The handles meeting this backend's key groups, after the checks every
        restore makes: an open backend, a source, at least one handle, of this
        backend's format or canonical, max parallelism and key serializer, each
        key group in one handle only. (Key groups no handle holds restore
        empty: a snapshot of part of the key groups is a valid snapshot; that a
        job's ``_metadata`` covers every key group is the checkpoint package's
        check.)"""
        self._check_open()
        if not isinstance(source, SnapshotSource):
            raise InvalidArgumentError(f"expected a SnapshotSource, got {type(source).__name__}")
        if isinstance(handles, KeyedStateHandle) or not isinstance(handles, Sequence):
            raise InvalidArgumentError(
                f"expected a sequence of KeyedStateHandles, got {type(handles).__name__}"
            )
        handles = list(handles)
        if not handles:
            raise InvalidArgumentError(
                "expected the handles of a snapshot to restore from, got none: a restore "
                "from nothing would empty every state"
            )
        self._check_formats(handles)
        for handle in handles:
            self._check_snapshot(handle.max_parallelism, handle.key_serializer, "snapshot")
        mine = overlapping(handles, self.key_group_range)
        owner: dict[int, int] = {}
        own = self.key_group_range
        for index, handle in enumerate(mine):
            for key_group in own.intersection(KeyGroupRange.of(*handle.key_group_range)):
                other = owner.setdefault(key_group, index)
                if other != index:
                    raise KeyGroupMismatchError(
                        f"expected every key group in one handle only, got key group "
                        f"{key_group} in the handles of {list(mine[other].key_group_range)} "
                        f"and {list(handle.key_group_range)}"
                    )
        return mine

    def _check_file_of(
        self, handle: KeyedStateHandle, path: str, metadata: SnapshotMetadata
    ) -> None:
        """A snapshot file (at ``path``) holds what its handle says: its key-group
        range, format, max parallelism, key serializer and states."""
        expected = (
            tuple(handle.key_group_range),
            handle.format,
            handle.max_parallelism,
            handle.key_serializer,
        )
        got = (
            tuple(metadata.key_group_range),
            metadata.format,
            metadata.max_parallelism,
            metadata.key_serializer,
        )
        if expected != got:
            raise SnapshotFormatError(
                f"expected {path!r} to hold key groups {list(expected[0])} in format "
                f"{expected[1]} of max parallelism {expected[2]} with key serializer "
                f"{expected[3]!r} as its handle says, the file holds key groups "
                f"{list(got[0])} in format {got[1]} of max parallelism {got[2]} with key "
                f"serializer {got[3]!r}"
            )
        if tuple(metadata.states) != tuple(handle.states):
            raise SnapshotFormatError(
                f"expected {path!r} to hold the states its handle lists "
                f"{[s.name for s in handle.states]}, the file holds "
                f"{[s.name for s in metadata.states]} (or other ids, kinds or serializers)"
            )

    def _check_formats(self, handles: Sequence[KeyedStateHandle]) -> None:
        """Refuse anything but handles of this backend's native format or canonical."""
        for handle in handles:
            if not isinstance(handle, KeyedStateHandle):
                raise InvalidArgumentError(
                    f"expected KeyedStateHandles, got {type(handle).__name__}"
                )
            check_handle_format(  # C6
                handle.format,
                handle.backend,
                backend_name=self.backend_name,
                native_format=self.native_format,
            )

    def _check_handles(self, handles: Sequence[KeyedStateHandle]) -> dict[str, StateMetaInfo]:
        """The meta info of every state of ``handles``, checked against this backend."""
        metas: dict[str, StateMetaInfo] = {}
        for handle in handles:
            self._check_snapshot(handle.max_parallelism, handle.key_serializer, "snapshot")
            if handle.states and not handle.files:
                raise SnapshotFormatError(
                    f"expected the files of the handle of key groups "
                    f"{list(handle.key_group_range)}, which lists states "
                    f"{[s.name for s in handle.states]}, got a handle without files"
                )
            for state in handle.states:
                self._restored_meta(state, metas)
        return metas

    def _check_snapshot(self, max_parallelism: int, key_serializer: str, what: str) -> None:
        """A snapshot (``what``: "snapshot" or "file") of this backend's max
        parallelism and key serializer, or a refusal."""
        check_max_parallelism(self.max_parallelism, max_parallelism)  # C1
        check_key_serializer(  # C2
            serializer_identifier(self._key_serializer), key_serializer, what
        )

    def _check_namespace_serializer(self, name: str, identifier: str, what: str) -> None:
        """State ``name`` restored with this backend's namespace serializer, or a refusal."""
        check_namespace_serializer(  # C3
            name, serializer_identifier(self._namespace_serializer), identifier, what
        )

    def _restored_meta(
        self, state: StateMetadata, metas: dict[str, StateMetaInfo]
    ) -> StateMetaInfo:
        """The meta info of one restored state (added to ``metas``), or a refusal:
        the namespace serializer must be the backend's; a registered (or already
        restored) state must have the same kind and state serializer."""
        name, kind, state_id = state.name, state.kind, state.state_serializer
        self._check_namespace_serializer(name, state.namespace_serializer, "snapshot")
        known = metas.get(name)
        holder = self._holders.get(name)
        if known is None and holder is not None and holder.descriptor is not None:
            known = self._meta_for(holder.descriptor)
        if known is not None:
            check_kind(name, known.kind, kind, "snapshot")  # C4
            check_serializer(  # C5
                f"the state serializer of {name!r}",
                serializer_identifier(known.state_serializer),
                state_id,
                "snapshot",
            )
        else:
            known = StateMetaInfo(name, kind, self._namespace_serializer, serializer_for(state_id))
        metas.setdefault(name, known)
        return known

    # ------------------------------------------------------------ resources

    def _release_resources(self) -> None:
        """What ``close()`` releases once no writer runs (nothing by default)."""

    def _start_async(
        self,
        checkpoint_id: int,
        write: Callable[[SnapshotFuture[R]], R],
        *,
        cleanup: Callable[[], None],
        failure: str,
        commit: Callable[[R], None] | None = None,
    ) -> SnapshotFuture[R]:
        """Run the asynchronous part of a snapshot on the writer thread.

        ``write(future)`` makes the result (it checks ``future.cancel_requested``
        between its steps and raises :class:`SnapshotCancelledError` then).
        ``cleanup()`` runs whatever happens -- also when the future is cancelled
        before it starts -- and *before* the future resolves, so whoever waits
        finds the snapshot's resources released and the snapshot no longer
        pending. ``commit(result)`` runs under the lock on success (bookkeeping
        the owner thread reads). Any other exception fails the future with a
        :class:`SnapshotWriteError` whose message ends with ``failure``.
        """
        future: SnapshotFuture[R] = SnapshotFuture(checkpoint_id, cleanup)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)  # cancelled before it started
        self._executor.submit(self._run_async, future, write, cleanup, failure, commit)
        return future

    def _run_async(
        self,
        future: SnapshotFuture[R],
        write: Callable[[SnapshotFuture[R]], R],
        cleanup: Callable[[], None],
        failure: str,
        commit: Callable[[R], None] | None,
    ) -> None:
        """The writer thread's side of :meth:`_start_async`."""
        if not future.start():
            return  # cancelled before it started
        outcome: R | BaseException
        try:
            outcome = write(future)
        except SnapshotCancelledError as exc:
            outcome = exc
        except BaseException as exc:  # anything fails the snapshot
            outcome = SnapshotWriteError(
                f"expected snapshot {future.checkpoint_id} to be written, got "
                f"{type(exc).__name__}: {exc}; {failure}"
            )
            outcome.__cause__ = exc
        finally:
            cleanup()
        with self._lock:
            if commit is not None and not isinstance(outcome, BaseException):
                commit(outcome)
            self._pending.discard(future)
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    @abstractmethod
    def _new_table(self, meta: StateMetaInfo) -> TableT:
        """A fresh, empty table for the state ``meta`` describes."""

    def _install_tables(self, tables: dict[str, TableT], metas: dict[str, StateMetaInfo]) -> None:
        """Swap restored tables in: registered states absent from ``tables`` become
        empty, restored states not registered yet keep their restored meta info;
        a registered state's table takes its descriptor's (it may have been
        registered after the restore was prepared)."""
        for name, holder in self._holders.items():
            new = tables.pop(name, None)
            if new is None:
                new = self._new_table(metas.get(name, holder.table.meta))
            if holder.descriptor is not None:
                new.set_meta_info(self._meta_for(holder.descriptor))
            holder.table = self._share_key_types(new)
        for name, table in tables.items():
            self._holders[name] = StateHolder(None, self._share_key_types(table), self._context)

    def _share_key_types(self, table: TableT) -> TableT:
        """``table`` holding the backend's key type (K1 of :mod:`cowstate.key_types`):
        a key its owner routes through it directly is held to the same type."""
        if isinstance(table, TableBase):
            table.key_types = self._context.key_types
        return table

    def _registered_metas(self) -> dict[str, StateMetaInfo]:
        """The meta info of every state registered by a descriptor."""
        return {
            name: self._meta_for(h.descriptor)
            for name, h in self._holders.items()
            if h.descriptor is not None
        }

    def _meta_for(self, descriptor: StateDescriptor | None) -> StateMetaInfo:
        assert descriptor is not None
        return StateMetaInfo(
            descriptor.name,
            StateKind(descriptor.kind),
            self._namespace_serializer,
            descriptor.serializer,
        )

    def _holder(self, name: str) -> StateHolder[TableT]:
        holder = self._holders.get(name)
        if holder is None:
            raise UnknownStateError(
                f"expected a registered state name ({', '.join(self._holders) or 'none'}), "
                f"got {name!r}"
            )
        return holder

    def _check_registered_since(self, staged: dict[str, StateMetaInfo]) -> None:
        """Every registered state the staged restore holds too has its kind and
        serializer there (a state registered after the prepare was not checked)."""
        for name, holder in self._holders.items():
            meta = staged.get(name)
            if holder.descriptor is None or meta is None:
                continue
            ours, theirs = _serializer_identifiers(meta, holder.descriptor)
            if meta.kind != holder.descriptor.kind or ours != theirs:
                raise StateRegistrationError(
                    f"expected state {name!r}, registered after the restore was prepared, to "
                    f"be a {meta.kind} state with serializer {ours!r} as the restore holds it, "
                    f"got a {holder.descriptor.kind} state descriptor with serializer "
                    f"{theirs!r}; the restore is discarded"
                )

    def _check_same_state(self, holder: StateHolder[TableT], descriptor: StateDescriptor) -> None:
        meta = holder.table.meta
        if meta.kind != descriptor.kind:
            raise StateRegistrationError(
                f"expected state {descriptor.name!r} to be registered again as a {meta.kind} "
                f"state, got a {descriptor.kind} state descriptor"
            )
        ours, theirs = _serializer_identifiers(meta, descriptor)
        if ours != theirs:
            raise StateRegistrationError(
                f"expected state {descriptor.name!r} with serializer {ours!r}, got {theirs!r}"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError("expected an open backend, got one that was closed")


def _serializer_identifiers(meta: StateMetaInfo, descriptor: StateDescriptor) -> tuple[str, str]:
    """The serializer identifiers of a registered (or restored) state and of a
    descriptor that names it, in that order."""
    return serializer_identifier(meta.state_serializer), serializer_identifier(
        descriptor.serializer
    )
