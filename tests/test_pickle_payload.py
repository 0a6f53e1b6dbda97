"""No code execution from a file: a pickle payload planted in a real snapshot
file, checkpoint or savepoint never runs on restore -- unless the user chose
the pickle serializer for it.

A writer job registers :class:`~cowstate.serializers.PickleSerializer` where
the payload goes -- as the backend's key serializer, its namespace serializer,
or the state's serializer -- and writes, through the real writers (valid
CRCs, sizes and ``_metadata``), entries whose key, namespace or state is a
:class:`Payload`: an object whose pickle is ``eval("<touch the marker file>
or n")``, the classic ``__reduce__`` attack. Every restore path then runs in
a job with the default serializers and must refuse with a ``cowstate.errors``
exception while the marker file stays absent:

- ``HeapKeyedStateBackend.restore`` from a snapshot file (state registered
  with the default serializer, or not registered at all);
- ``CheckpointCoordinator.restore`` from the checkpoint in CLAIM, NO_CLAIM and
  LEGACY mode, heap and RocksDB, at the same parallelism and rescaled;
- ``CheckpointCoordinator.recover`` of the writer's job directory;
- native savepoints (same backend) and canonical savepoints (either backend);
- ``cowstate savepoint inspect`` of the checkpoint and both savepoints.

The control: the same restores in a job that registered the pickle
serializer where the payload is run the payload (the marker appears once
everything restored is read), so the test can fail.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.handles import RestoreMode
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.cli import main as cowstate_main
from cowstate.descriptors import ValueStateDescriptor
from cowstate.errors import CowStateError, SerializerMismatchError
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.serializers import DefaultSerializer, PickleSerializer, StateSerializer

MAXP = 16
NAME = "value"
LOCATIONS = ["key", "namespace", "state"]
KINDS = ["heap", "rocksdb"]
ENTRIES = 12


class Payload:
    """A hashable value whose pickle, when loaded, touches ``marker`` and yields ``n``."""

    def __init__(self, marker: Path, n: int) -> None:
        self.marker = marker
        self.n = n

    def __reduce__(self) -> tuple[Any, ...]:
        return (eval, (f"__import__('pathlib').Path({str(self.marker)!r}).touch() or {self.n}",))

    def __deepcopy__(self, memo: Any) -> Payload:
        return self  # immutable: a copy must not go through __reduce__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Payload) and (other.marker, other.n) == (self.marker, self.n)

    def __hash__(self) -> int:
        return hash((self.n, "payload"))


# ------------------------------------------------------------ the writer


def serializers(location: str, pickled: bool) -> tuple[dict[str, StateSerializer], Any]:
    """Backend keyword arguments and the state's serializer: pickle at ``location``."""
    chosen: dict[str, StateSerializer] = {
        loc: (PickleSerializer() if pickled and loc == location else DefaultSerializer())
        for loc in LOCATIONS
    }
    kwargs = {"key_serializer": chosen["key"], "namespace_serializer": chosen["namespace"]}
    return kwargs, chosen["state"]


def make_backend(kind: str, key_groups: KeyGroupRange, location: str, pickled: bool) -> Any:
    kwargs, _ = serializers(location, pickled)
    key, namespace = kwargs["key_serializer"], kwargs["namespace_serializer"]
    if kind == "heap":
        return HeapKeyedStateBackend(
            key_groups, MAXP, key_serializer=key, namespace_serializer=namespace
        )
    return RocksDBKeyedStateBackend(
        key_groups, MAXP, key_serializer=key, namespace_serializer=namespace
    )


def descriptor(location: str, pickled: bool) -> ValueStateDescriptor[Any]:
    return ValueStateDescriptor(NAME, serializer=serializers(location, pickled)[1])


def job(
    kind: str, parallelism: int, location: str, *, pickled: bool, register: bool = True
) -> list[Any]:
    backends = [
        make_backend(
            kind,
            compute_key_group_range_for_operator_index(MAXP, parallelism, i),
            location,
            pickled,
        )
        for i in range(parallelism)
    ]
    if register:
        for backend in backends:
            backend.get_state(descriptor(location, pickled))
    return backends


@dataclass
class Written:
    """What a writer job left on disk (kept by the module fixture, copied per test).

    The payloads name the absolute ``marker`` path: the copies share it, so each
    test starts by removing it (the tests of one process run one at a time).
    """

    root: Path
    marker: Path
    checkpoint: Path
    native: Path
    canonical: Path
    heap_file: bytes | None


def write(root: Path, kind: str, location: str) -> Written:
    marker = root / "PAYLOAD-RAN"
    backends = job(kind, 2, location, pickled=True)
    key_serializer = backends[0].key_serializer
    coordinator = CheckpointCoordinator(CheckpointStorage(str(root), "writer"), backends)
    for n in range(ENTRIES):
        payload = Payload(marker, n)
        key = payload if location == "key" else n
        group = assign_to_key_group(key, MAXP, key_serializer)
        backend = next(b for b in backends if group in b.key_group_range)
        backend.set_current_key(key)
        backend.set_current_namespace(payload if location == "namespace" else VOID_NAMESPACE)
        backend.get_state(descriptor(location, True)).update(payload if location == "state" else n)
    coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    coordinator.trigger_savepoint(str(root / "sp-native"), "native")
    coordinator.trigger_savepoint(str(root / "sp-canonical"), "canonical")
    heap_file = None
    if kind == "heap":
        heap_file = backends[0].snapshot(1000, io.BytesIO).result().handle.getvalue()
    for backend in backends:
        backend.close()
    [checkpoint] = sorted((root / "writer").glob("chk-*"))
    assert not marker.exists(), "writing a pickle must not run it"
    return Written(root, marker, checkpoint, root / "sp-native", root / "sp-canonical", heap_file)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Written]:
    return {
        (kind, location): write(tmp_path_factory.mktemp(f"{kind}-{location}"), kind, location)
        for kind in KINDS
        for location in LOCATIONS
    }


def fresh(written: dict[tuple[str, str], Written], kind: str, location: str) -> Written:
    """The writer's files, with the marker of an earlier test's control removed."""
    original = written[(kind, location)]
    original.marker.unlink(missing_ok=True)
    return original


@pytest.fixture
def copy_of(
    written: dict[tuple[str, str], Written], tmp_path: Path
) -> Callable[[str, str], Written]:
    """A private copy of a writer's files (CLAIM and recover may change them)."""

    def make(kind: str, location: str) -> Written:
        original = fresh(written, kind, location)
        root = tmp_path / "copy"
        shutil.copytree(original.root, root)
        relative = {
            name: root / getattr(original, name).relative_to(original.root)
            for name in ("checkpoint", "native", "canonical")
        }
        return Written(root, original.marker, heap_file=original.heap_file, **relative)

    return make


# ------------------------------------------------------------ restoring


def read_everything(backends: list[Any]) -> None:
    """Decode every restored key, namespace and state (RocksDB decodes on read)."""
    for backend in backends:
        for name in backend.state_names:
            for entry in backend.entries(name):
                _ = (entry.key, entry.namespace, entry.state)


@contextlib.contextmanager
def closing_all(backends: list[Any]) -> Iterator[list[Any]]:
    try:
        yield backends
    finally:
        for backend in backends:
            backend.close()


def refused(marker: Path, action: Callable[[], Any]) -> BaseException:
    with pytest.raises(CowStateError) as info:
        action()
    assert not marker.exists(), f"the payload ran before the refusal: {info.value}"
    return info.value


def ran(marker: Path, action: Callable[[], Any]) -> None:
    """The control: with the pickle serializer chosen, the payload runs (the
    restore itself may then fail on what the payload returned)."""
    with contextlib.suppress(Exception):
        action()
    assert marker.exists(), "the control did not run the payload: the test could not fail"


def coordinator_restore(
    kind: str,
    parallelism: int,
    location: str,
    directory: Path,
    mode: RestoreMode,
    *,
    pickled: bool,
    register: bool = True,
    root: Path,
) -> Callable[[], None]:
    def action() -> None:
        with closing_all(
            job(kind, parallelism, location, pickled=pickled, register=register)
        ) as bs:
            CheckpointCoordinator.restore(
                CheckpointStorage(str(root), f"restored-{kind}-{parallelism}"),
                bs,
                str(directory),
                mode,
            )
            read_everything(bs)

    return action


BOTH_LOCATIONS_AND_KINDS = pytest.mark.parametrize(
    "kind, location", [(k, loc) for k in KINDS for loc in LOCATIONS]
)


@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("register", [True, False], ids=["registered", "unregistered"])
def test_heap_restore_from_a_snapshot_file(
    written: dict[tuple[str, str], Written], location: str, register: bool
) -> None:
    w = fresh(written, "heap", location)
    assert w.heap_file is not None

    def restore(pickled: bool) -> Callable[[], None]:
        # An unregistered pickle state is refused even with pickle chosen elsewhere:
        # the control registers it (the user's way to trust the file).
        registered = register or (pickled and location == "state")

        def action() -> None:
            with closing_all(job("heap", 1, location, pickled=pickled, register=registered)) as bs:
                bs[0].restore([w.heap_file])
                read_everything(bs)

        return action

    error = refused(w.marker, restore(False))
    assert isinstance(error, SerializerMismatchError)
    ran(w.marker, restore(True))


@BOTH_LOCATIONS_AND_KINDS
@pytest.mark.parametrize("mode", list(RestoreMode), ids=lambda m: m.name)
def test_checkpoint_restore_in_every_mode(
    copy_of: Callable[[str, str], Written], kind: str, location: str, mode: RestoreMode
) -> None:
    w = copy_of(kind, location)
    refused(
        w.marker,
        coordinator_restore(kind, 2, location, w.checkpoint, mode, pickled=False, root=w.root),
    )
    ran(
        w.marker,
        coordinator_restore(kind, 2, location, w.checkpoint, mode, pickled=True, root=w.root),
    )


@BOTH_LOCATIONS_AND_KINDS
def test_checkpoint_restore_of_unregistered_states(
    copy_of: Callable[[str, str], Written], kind: str, location: str
) -> None:
    w = copy_of(kind, location)
    refused(
        w.marker,
        coordinator_restore(
            kind,
            2,
            location,
            w.checkpoint,
            RestoreMode.NO_CLAIM,
            pickled=False,
            register=False,
            root=w.root,
        ),
    )
    ran(
        w.marker,
        coordinator_restore(
            kind,
            2,
            location,
            w.checkpoint,
            RestoreMode.NO_CLAIM,
            pickled=True,
            register=False,
            root=w.root,
        )
        if location != "state"
        # an unregistered pickle state is refused even then: register it to trust the file
        else coordinator_restore(
            kind, 2, location, w.checkpoint, RestoreMode.NO_CLAIM, pickled=True, root=w.root
        ),
    )


@BOTH_LOCATIONS_AND_KINDS
@pytest.mark.parametrize("parallelism", [1, 3])
def test_rescaling_restore(
    copy_of: Callable[[str, str], Written], kind: str, location: str, parallelism: int
) -> None:
    w = copy_of(kind, location)
    for directory in (w.checkpoint, w.canonical):
        refused(
            w.marker,
            coordinator_restore(
                kind,
                parallelism,
                location,
                directory,
                RestoreMode.NO_CLAIM,
                pickled=False,
                root=w.root,
            ),
        )
    ran(
        w.marker,
        coordinator_restore(
            kind,
            parallelism,
            location,
            w.checkpoint,
            RestoreMode.NO_CLAIM,
            pickled=True,
            root=w.root,
        ),
    )


#: A native savepoint restores into its own backend only; a canonical one into either.
SAVEPOINT_TARGETS = [("native", "same"), ("canonical", "heap"), ("canonical", "rocksdb")]


@BOTH_LOCATIONS_AND_KINDS
@pytest.mark.parametrize("savepoint, target", SAVEPOINT_TARGETS)
def test_savepoint_restore(
    copy_of: Callable[[str, str], Written], kind: str, location: str, savepoint: str, target: str
) -> None:
    target = kind if target == "same" else target
    w = copy_of(kind, location)
    directory = w.native if savepoint == "native" else w.canonical
    refused(
        w.marker,
        coordinator_restore(
            target, 2, location, directory, RestoreMode.NO_CLAIM, pickled=False, root=w.root
        ),
    )
    ran(
        w.marker,
        coordinator_restore(
            target, 2, location, directory, RestoreMode.NO_CLAIM, pickled=True, root=w.root
        ),
    )


@BOTH_LOCATIONS_AND_KINDS
def test_recover(copy_of: Callable[[str, str], Written], kind: str, location: str) -> None:
    w = copy_of(kind, location)

    def recover(pickled: bool) -> Callable[[], None]:
        def action() -> None:
            with closing_all(job(kind, 2, location, pickled=pickled)) as bs:
                CheckpointCoordinator.recover(CheckpointStorage(str(w.root), "writer"), bs)
                read_everything(bs)

        return action

    refused(w.marker, recover(False))
    ran(w.marker, recover(True))


@BOTH_LOCATIONS_AND_KINDS
def test_savepoint_inspect_never_decodes(
    written: dict[tuple[str, str], Written],
    kind: str,
    location: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = fresh(written, kind, location)
    for directory in (w.checkpoint, w.native, w.canonical):
        assert cowstate_main(["savepoint", "inspect", str(directory)]) == 0
        assert "files: all present" in capsys.readouterr().out
    assert not w.marker.exists()
