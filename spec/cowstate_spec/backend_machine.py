"""The backend state machine: a keyed state backend and the reference backend,
side by side, while asynchronous snapshot writers race the owner.

One rule per operation of the state API (``value_update``, ``list_add``,
``map_put``, ``reducing_add``, ...: each kind's rules are in its row of
:mod:`cowstate_spec.kinds`, and become the machine's methods under their
names), applied to both at the current key and namespace; results and
refusals must agree. States handed out are mutated in
place by the caller, as the contract allows until the next snapshot.

``snapshot`` takes the synchronous part on both and lets the implementation's
writer thread run while the following rules keep mutating the live backend
(the test sets ``sys.setswitchinterval`` tiny, and the writer's stream passes a
:class:`~cowstate_spec.backends.WriteGate` that grants one write per owner
operation, so every snapshot is written while the owner mutates, block by
block). ``complete_snapshot``
waits for the writer and requires that the bytes decode to exactly the model's
snapshot of the synchronous moment; ``cancel_snapshot`` cancels one (whatever
it managed to write is discarded). ``restore`` replaces both backends by ones
restored from a completed snapshot; ``rescale`` restores a completed snapshot
into several backends with split key-group ranges and requires every mapping
in exactly the backend that owns its key group.

Keys: each run's ``load`` fixes the backend's key type with keys of one
family (ints, strings or floats); the rules then draw keys of every family and
Python's equal keys of other types (``1``, ``1.0``, ``True``, ``0.0``,
``-0.0``, NaN, ``(1, 'a')`` / ``(1.0, 'a')``), which both sides must refuse
alike (one key type per backend, :mod:`cowstate.key_types`);
``set_current_key_twice`` sets two such keys in a row, and the current key
must agree by type, not only by ``==``.

The implementation's states are registered with a :class:`GatedSerializer`
(the default serializer's identifier and bytes) whose ``serialize`` passes the
write gate on a writer thread, so the owner also runs between a writer
reading a state and serializing it; ``complete_snapshot_mutating_what_it_reads``
drives a writer one write at a time and, each time it waits to serialize a
state the live backend still holds, first mutates that mapping through the
state API. ``restore_a_corrupted_copy`` requires a completed snapshot file
with a bit flipped to be refused, and the restoring backend to stay empty;
``fill_every_key_group`` puts a key in every key group; ``rescale`` requires
the operators together to restore the whole snapshot (``operator_range`` is
the range function it splits with).

Invariants: every state's live contents equal the model's, keys compared by
type too; once no writer is pending, no copy-on-write map holds an open snapshot version (every map
snapshot was released after success, failure or cancellation).

``backend_machine_for(..., hostile=True)`` adds :class:`HostileUserCode`: an
aggregating state whose aggregate function mutates the accumulator and then
raises must give TransformFunctionError and keep the transform contract (rule
U of ``cowstate.state_map``). It is not in the plain machine, whose
derandomized examples (and the coverage measured on them) any new rule would
change.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cowstate.descriptors import AggregatingStateDescriptor, StateDescriptor
from cowstate.errors import CowStateError, SnapshotCancelledError, TransformFunctionError
from cowstate.key_groups import KeyGroupRange, compute_key_group_range_for_operator_index
from cowstate.keyed_state import VOID_NAMESPACE
from cowstate.serializers import DefaultSerializer
from cowstate.state_table import StateTable
from cowstate_model.backend import ReferenceKeyedStateBackend
from cowstate_model.key_groups import assign_to_key_group
from cowstate_spec import contract as c
from cowstate_spec import coverage as cov
from cowstate_spec.backends import (
    DESCRIPTORS,
    BackendImplementation,
    WriteGate,
    restore_results,
)
from cowstate_spec.cmap_view import MAP_CLASSES, view_of
from cowstate_spec.hostile import Trapped
from cowstate_spec.invariants import changed_keys
from cowstate_spec.keys import EQUAL_KEYS, typed_keys
from cowstate_spec.kinds import KINDS, small_ints
from cowstate_spec.machine import Outcome

__all__ = [
    "BackendMachine",
    "ChangeTracking",
    "HostileUserCode",
    "backend_machine_for",
    "with_kind_rules",
]

MAX_PARALLELISM = 8
WAIT = 60.0  # seconds a writer may take at most
#: One key in each key group 0..7 of MAX_PARALLELISM (fill_every_key_group).
KEY_PER_KEY_GROUP = ("d", 3, 6, 9, "e", 27, 0, 2)
CORRUPTIONS = 8  # restore_a_corrupted_copy: copies with one bit flipped each
MAX_DRIVEN_WRITES = 400  # complete_snapshot_mutating_what_it_reads: then the gate opens

#: Equal keys of different types and keys no backend takes (NaN, -0.0).
equal_keys = st.sampled_from([*EQUAL_KEYS, float("nan"), (1, "a"), (1.0, "a")])
keys = st.one_of(
    st.integers(0, 11), st.sampled_from(["a", "b", "é"]), st.sampled_from([2.5, 1.0]), equal_keys
)
#: The keys ``load`` starts a run with: one family per run fixes the key type.
KEY_FAMILIES: dict[str, list[Any]] = {
    "int": list(range(12)),
    "str": ["a", "b", "é", "c", "d", "e", "f", "g"],
    "float": [0.0, 1.0, 2.5, -3.0, 4.25, 5.5, 6.0, 7.75],
}
namespaces = st.sampled_from([VOID_NAMESPACE, "w1", 2])


M = TypeVar("M", bound=RuleBasedStateMachine)


def with_kind_rules(machine: type[M]) -> type[M]:
    """``machine`` with every kind's rules (:mod:`cowstate_spec.kinds`) as its
    methods, under their names; a name the machine has already is refused (it
    would replace that rule silently)."""
    # rule(**arguments): the arguments are strategies only (no target)
    make_rule: Callable[..., Callable[[Callable[..., None]], Callable[..., None]]] = rule
    for kind in KINDS.values():
        for kind_rule in kind.rules:
            if hasattr(machine, kind_rule.name):
                raise TypeError(
                    f"expected a new rule name for the {kind.descriptor.kind} kind's rule, "
                    f"got {kind_rule.name!r}, which {machine.__name__} has already"
                )
            setattr(machine, kind_rule.name, make_rule(**kind_rule.strategies(st))(kind_rule.run))
    return machine


@with_kind_rules
class BackendMachine(RuleBasedStateMachine):
    """Drives ``implementation`` and the reference backend with the same calls;
    the rules of each kind's handle come from :mod:`cowstate_spec.kinds`."""

    implementation: BackendImplementation
    key_group_range: KeyGroupRange
    #: How ``rescale`` splits the key groups (a broken one must be caught).
    operator_range: Callable[[int, int, int], KeyGroupRange] = staticmethod(
        compute_key_group_range_for_operator_index
    )

    def __init__(self) -> None:
        super().__init__()
        self.backend = self.implementation.factory(self.key_group_range, MAX_PARALLELISM)
        self.model = ReferenceKeyedStateBackend(
            self.key_group_range, MAX_PARALLELISM, default_namespace=VOID_NAMESPACE
        )
        self.gate = WriteGate(timeout=WAIT)  # before register(): the serializers pass it
        self.writer_serializer = GatedSerializer(self.gate, threading.get_ident())
        self.writer_descriptors = gated_descriptors(self.writer_serializer)
        self.register()
        self.pending: list[tuple[Any, Any]] = []  # (future, model snapshot)
        self.completed: list[tuple[Any, Any]] = []  # (result, model snapshot)
        self.next_id = 1

    def register(self) -> None:
        self.states = {
            name: (self.backend.get_state(self.writer_descriptors[name]), self.model.get_state(d))
            for name, d in DESCRIPTORS.items()
        }

    # ------------------------------------------------------------- helpers

    def both(self, call: Callable[[Any], Any]) -> tuple[Any, Any]:
        """``call(backend)`` and ``call(model)``: both succeed or both refuse."""
        self.gate.tick()
        impl = Outcome(lambda: call(self.backend))
        model = Outcome(lambda: call(self.model))
        assert (impl.error is None) == (model.error is None), (
            f"implementation {impl}, model {model}"
        )
        if impl.error is not None:
            assert isinstance(impl.error, CowStateError), (
                f"raised {impl.error!r}, expected a cowstate.errors exception"
            )
        return impl.value, model.value

    def on_state(self, name: str, operation: str, *args: Any) -> tuple[Any, Any]:
        self.gate.tick()
        if self.pending:
            self.record_writer_in_key_group(name)
        impl_state, model_state = self.states[name]
        model_args = copy.deepcopy(args)
        impl = Outcome(lambda: getattr(impl_state, operation)(*args))
        model = Outcome(lambda: getattr(model_state, operation)(*model_args))
        assert (impl.error is None) == (model.error is None), (
            f"{name}.{operation}{args!r}: implementation {impl}, model {model}"
        )
        if impl.error is not None:
            assert isinstance(impl.error, CowStateError), (
                f"{name}.{operation}{args!r} raised {impl.error!r}, expected a cowstate.errors "
                "exception"
            )
        assert impl.value == model.value, (
            f"{name}.{operation}{args!r}: implementation {impl.value!r}, model {model.value!r}"
        )
        return impl.value, model.value

    def record_writer_in_key_group(self, name: str) -> None:
        """A coverage event when the owner is about to touch state ``name`` in a
        key group whose map a pending writer still holds (a snapshot version of
        the map is open: the writer has not released that key group yet)."""
        table = self.backend.table(name)
        if not isinstance(table, StateTable):
            return  # the RocksDB backend: no per-key-group maps to read
        try:
            m = table.state_map(self.backend.current_key_group)
        except CowStateError:
            return  # no current key: the operation is refused anyway
        if isinstance(m, MAP_CLASSES) and view_of(m)._open_versions:
            cov.record(cov.WRITER_AND_OWNER_SAME_KEY_GROUP)

    def mutate(self, pair: tuple[Any, Any], item: int) -> None:
        """The caller mutates what it got (allowed until the next snapshot): on both
        sides where returned objects are the stored ones, else on the copy only."""
        impl, model = pair
        if c.mutate_in_place(impl, item) and self.implementation.mutations_persist:
            c.mutate_in_place(model, item)

    @initialize(count=st.integers(0, 12), family=st.sampled_from(sorted(KEY_FAMILIES)))
    def load(self, count: int, family: str) -> None:
        """Start with state for the first ``count`` keys of ``family`` the backend
        holds; the first fixes the key type."""
        owned = [
            k
            for k in KEY_FAMILIES[family]
            if assign_to_key_group(k, MAX_PARALLELISM) in self.key_group_range
        ]
        for key in owned[:count]:
            self.both(operator.methodcaller("set_current_key", key))
            for kind in KINDS.values():
                kind.load(self, key)
        self.both(lambda b: b.set_current_key(owned[0]))

    # -------------------------------------------------------- key context

    @rule(key=keys)
    def set_current_key(self, key: Any) -> None:
        self.both(lambda b: b.set_current_key(key))
        self.current_keys_agree()

    @rule(first=st.one_of(equal_keys, keys), second=equal_keys)
    def set_current_key_twice(self, first: Any, second: Any) -> None:
        """Two keys in a row, the second (often) equal to the first in Python:
        ``True`` after ``1`` is another key or a refusal, never the same key."""
        self.both(lambda b: b.set_current_key(first))
        self.both(lambda b: b.set_current_key(second))
        self.current_keys_agree()
        self.on_state("value", "value")

    def current_keys_agree(self) -> None:
        impl = Outcome(lambda: self.backend.current_key)
        model = Outcome(lambda: self.model.current_key)
        assert (impl.error is None) == (model.error is None), f"current key {impl}, {model}"
        assert (type(impl.value), impl.value) == (type(model.value), model.value), (
            f"current key: implementation {impl.value!r}, model {model.value!r}"
        )

    @rule(namespace=namespaces)
    def set_current_namespace(self, namespace: Any) -> None:
        self.both(lambda b: b.set_current_namespace(namespace))

    # --------------------------------------- every kind (its own rules: kinds.py)

    @rule(name=st.sampled_from(sorted(DESCRIPTORS)))
    def clear(self, name: str) -> None:
        self.on_state(name, "clear")

    @rule(name=st.sampled_from(sorted(DESCRIPTORS)), other=st.sampled_from(sorted(DESCRIPTORS)))
    def register_as_another_kind(self, name: str, other: str) -> None:
        descriptor = DESCRIPTORS[other]
        if descriptor.kind == DESCRIPTORS[name].kind:
            return
        clash = copy.copy(descriptor)
        object.__setattr__(clash, "name", name)
        self.both(lambda b: b.get_state(clash))

    # ------------------------------------------------------------ snapshots

    @precondition(lambda self: len(self.pending) < 3)
    @rule()
    def snapshot(self) -> None:
        checkpoint_id = self.next_id
        self.next_id += 1
        future = self.implementation.snapshot(self.backend, checkpoint_id, self.gate)
        model = self.model.snapshot(checkpoint_id).result()
        self.pending.append((future, model))

    @precondition(lambda self: bool(self.pending))
    @rule(index=st.integers(0, 3))
    def complete_snapshot(self, index: int) -> None:
        future, model = self.pending.pop(index % len(self.pending))
        result = self.wait(future)
        self.check_written(result, model)
        self.completed = [*self.completed[-2:], (result, model)]

    @precondition(lambda self: bool(self.pending))
    @rule(index=st.integers(0, 3))
    def cancel_snapshot(self, index: int) -> None:
        future, model = self.pending.pop(index % len(self.pending))
        future.cancel()
        try:
            result = self.wait(future)
        except SnapshotCancelledError:
            return
        except Exception as exc:  # concurrent.futures.CancelledError
            assert future.cancelled(), f"a cancelled snapshot failed with {exc!r}"
            return
        self.check_written(result, model)  # it finished before the cancel was seen

    def wait(self, future: Any) -> Any:
        """Let the writers run to the end of ``future``, then gate them again."""
        self.gate.open()
        try:
            return future.result(timeout=WAIT)
        finally:
            self.gate.close()

    def check_written(self, result: Any, model: Any) -> None:
        written = self.implementation.read(result, self.backend)
        expected = {name: dict(contents) for name, contents in model.states.items()}
        assert written == expected, (
            f"snapshot {model.checkpoint_id} wrote {written!r}, the model's snapshot at the "
            f"synchronous moment is {expected!r}"
        )

    @precondition(lambda self: bool(self.completed))
    @rule(index=st.integers(0, 2))
    def restore(self, index: int) -> None:
        result, model = self.completed[index % len(self.completed)]
        backend = self.implementation.factory(self.key_group_range, MAX_PARALLELISM)
        restore_results(backend, [result])
        reference = ReferenceKeyedStateBackend(
            self.key_group_range, MAX_PARALLELISM, default_namespace=VOID_NAMESPACE
        )
        reference.restore([model])
        self.finish_pending()
        self.backend.close()
        self.backend, self.model = backend, reference
        self.register()

    @precondition(lambda self: bool(self.completed))
    @rule(index=st.integers(0, 2), parallelism=st.integers(2, 3))
    def rescale(self, index: int, parallelism: int) -> None:
        result, model = self.completed[index % len(self.completed)]
        restored: dict[str, dict[tuple[Any, Any], Any]] = {name: {} for name in model.states}
        for index_ in range(parallelism):
            key_groups = self.operator_range(MAX_PARALLELISM, parallelism, index_)
            backend = self.implementation.factory(key_groups, MAX_PARALLELISM)
            try:
                restore_results(backend, [result])
                for name, contents in model.states.items():
                    mine = {
                        kn: s
                        for kn, s in contents.items()
                        if assign_to_key_group(kn[0], MAX_PARALLELISM) in key_groups
                    }
                    held = {(k, n): s for k, n, s in backend.entries(name)}
                    assert held == mine, (
                        f"operator {index_} of {parallelism} ({key_groups!r}) restored "
                        f"{name} = {held!r}, expected {mine!r}"
                    )
                    restored[name].update(held)
            finally:
                backend.close()
        expected = {name: dict(contents) for name, contents in model.states.items()}
        assert restored == expected, (
            f"the {parallelism} operators together restored {restored!r}, the snapshot "
            f"holds {expected!r}: a key group belongs to no operator"
        )

    def finish_pending(self) -> None:
        for future, model in self.pending:
            self.check_written(self.wait(future), model)
        self.pending.clear()

    # --------------------------- rules that back the bad layers' catches
    # (cowstate_spec.bad_layers: a snapshot reader, writer, serializer or
    # rescaling range broken on purpose, each caught by a rule)

    @precondition(lambda self: any(_is_bytes_handle(result) for result, _ in self.completed))
    @rule(index=st.integers(0, 2), position=st.integers(0, 1 << 16), bit=st.integers(0, 7))
    def restore_a_corrupted_copy(self, index: int, position: int, bit: int) -> None:
        """A completed snapshot file with one bit flipped must be refused with a
        ``cowstate.errors`` exception, and the backend restoring it stays empty:
        ``CORRUPTIONS`` copies, each with another byte flipped, spread over the
        file (header, key-group blocks, index, footer)."""
        files = [result for result, _ in self.completed if _is_bytes_handle(result)]
        original = files[index % len(files)].handle.getvalue()
        for k in range(CORRUPTIONS):
            at = (position + k * len(original) // CORRUPTIONS) % len(original)
            data = bytearray(original)
            data[at] ^= 1 << bit
            backend = self.implementation.factory(self.key_group_range, MAX_PARALLELISM)
            try:
                outcome = Outcome(functools.partial(backend.restore, [bytes(data)]))
                assert isinstance(outcome.error, CowStateError), (
                    f"restoring a snapshot with bit {bit} of byte {at} flipped {outcome}, "
                    "expected a cowstate.errors exception"
                )
                assert not backend.state_names, (
                    f"a refused restore left states {sorted(backend.state_names)} behind"
                )
            finally:
                backend.close()

    @rule(value=small_ints(st))
    def fill_every_key_group(self, value: int) -> None:
        """A value (a list) and a map entry (a list too) at one key of every key
        group of the range: a snapshot then has something to lose everywhere
        (a dropped key group, a key group no rescaled operator owns, a block a
        corruption hits) and map values a shallow copy would share."""
        for key in KEY_PER_KEY_GROUP:
            if assign_to_key_group(key, MAX_PARALLELISM) in self.key_group_range:
                self.both(operator.methodcaller("set_current_key", key))
                self.on_state("value", "update", [key, value])
                self.on_state("map", "put", "w", [value])

    @precondition(lambda self: bool(self.pending))
    @rule(index=st.integers(0, 3), item=st.integers(0, 99))
    def complete_snapshot_mutating_what_it_reads(self, index: int, item: int) -> None:
        """``complete_snapshot``, driving the writers one write at a time: each
        time a writer waits to serialize a mutable state the live backend still
        holds, the owner first mutates that very mapping through the state API
        (granting no write meanwhile). A map snapshot still open for its key
        group must keep the writer's object intact (rule S), so the file must
        still hold the synchronous moment."""
        future, model = self.pending.pop(index % len(self.pending))
        serializer = self.writer_serializer
        # Only a heap writer serializes states (RocksDB's uploads files).
        driven = MAX_DRIVEN_WRITES if isinstance(self.backend.table("value"), StateTable) else 0
        if driven:
            # The owner's operations since the last completion left credits: with
            # them the writer would pass gates, serializers among them, unseen.
            self.gate.close()
        for _ in range(driven):
            # One write granted at a time, each to the writer already waiting for
            # it: every state it serializes is seen waiting (no timing involved).
            if not self.gate.await_writer(future.done, WAIT):
                break
            if serializer.waiting.is_set():
                self.mutate_what_the_writer_reads(serializer.reading, item)
            self.gate.tick()
        result = self.wait(future)
        self.check_written(result, model)
        self.completed = [*self.completed[-2:], (result, model)]

    def mutate_what_the_writer_reads(self, reading: Any, item: int) -> None:
        if type(reading) not in (list, dict):
            return  # gone meanwhile, or an immutable state
        found = next(
            (
                (kind.mutate_held, key, namespace)
                for name, kind in KINDS.items()
                if kind.mutate_held is not None
                for key, namespace, state in self.backend.entries(name)
                if state is reading
            ),
            None,
        )
        if found is None:
            return  # the live backend no longer holds it (replaced or copied)
        mutate_held, key, namespace = found
        with self.writes_withheld():
            self.both(lambda b: b.set_current_key(key))
            self.both(lambda b: b.set_current_namespace(namespace))
            mutate_held(self, reading, item)

    @contextlib.contextmanager
    def writes_withheld(self) -> Iterator[None]:
        """The owner's operations grant the writers no write meanwhile."""
        self.gate.tick = lambda: None  # type: ignore[method-assign]
        try:
            yield
        finally:
            del self.gate.tick

    # ------------------------------------------------------------ invariants

    @invariant()
    def contents_agree(self) -> None:
        for name in DESCRIPTORS:
            entries = list(self.backend.entries(name))
            live = {(k, n): s for k, n, s in entries}
            expected = self.model.contents(name)
            assert live == expected, f"{name}: implementation {live!r}, model {expected!r}"
            typed = typed_keys((k, n, s) for (k, n), s in expected.items())
            assert typed_keys(entries) == typed, f"{name}: keys differ by type"

    @invariant()
    def snapshots_released_when_written(self) -> None:
        if self.pending:
            return
        assert self.backend.pending_snapshots == 0
        for name in DESCRIPTORS:
            table = self.backend.table(name)
            if not isinstance(table, StateTable):
                continue  # no copy-on-write maps to release
            for key_group in table.key_group_range:
                m = table.state_map(key_group)
                if isinstance(m, MAP_CLASSES):
                    assert not m._open_versions, (
                        f"{name}, key group {key_group}: snapshot versions "
                        f"{sorted(m._open_versions)} still open with no writer pending"
                    )

    def teardown(self) -> None:
        try:
            self.finish_pending()
        finally:
            self.gate.open()
            self.backend.close()


class AppendThenRaise:
    """An aggregate function that appends each value to its accumulator, and
    raises (:class:`~cowstate_spec.hostile.Trapped`) after appending a
    negative one."""

    def create_accumulator(self) -> list[int]:
        return []

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator.append(value)
        if value < 0:
            raise Trapped(f"aggregate function refuses {value} after appending it")
        return accumulator

    def get_result(self, accumulator: list[int]) -> list[int]:
        return list(accumulator)

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return a + b

    def __repr__(self) -> str:
        return "AppendThenRaise()"


HOSTILE = AggregatingStateDescriptor("hostile", aggregate_function=AppendThenRaise())


class HostileUserCode(BackendMachine):
    """The backend machine plus a state whose aggregate function mutates, then raises."""

    def register(self) -> None:
        super().register()
        self.hostile = (self.backend.get_state(HOSTILE), self.model.get_state(HOSTILE))

    @rule(value=st.integers(-3, 3))
    def hostile_aggregating_add(self, value: int) -> None:
        """``add(value)``; a negative value makes the function append it and
        raise. TransformFunctionError, and the accumulator is the one before
        plus the appended value exactly when the backend handed the function
        the stored accumulator -- which it must on the heap with no writer
        pending, and never on RocksDB. The model follows what happened."""
        self.gate.tick()
        impl_state, model_state = self.hostile
        if value >= 0 or Outcome(lambda: self.backend.current_key).error is not None:
            self.both(lambda b: (impl_state if b is self.backend else model_state).add(value))
            return
        at = (self.backend.current_key, self.backend.current_namespace)
        before = copy.deepcopy(self.accumulator_at(at))
        outcome = Outcome(lambda: impl_state.add(value))
        assert isinstance(outcome.error, TransformFunctionError), f"add({value}) {outcome}"
        assert isinstance(outcome.error.__cause__, Trapped)
        after = self.accumulator_at(at)
        kept = before is not None and after == [*before, value]
        assert kept or after == before, f"add({value}): {before!r} became {after!r}"
        if before is not None and not self.pending:
            assert kept == self.implementation.mutations_persist, (
                f"add({value}) with no writer pending: {before!r} became {after!r}"
            )
        if kept:  # the model's function mutates its stored accumulator too
            model = Outcome(lambda: model_state.add(value))
            assert isinstance(model.error, Trapped), f"model add({value}) {model}"
        live = {(k, n): s for k, n, s in self.backend.entries(HOSTILE.name)}
        expected = self.model.contents(HOSTILE.name)
        assert live == expected, f"hostile: implementation {live!r}, model {expected!r}"

    def accumulator_at(self, at: tuple[Any, Any]) -> Any:
        return next((s for k, n, s in self.backend.entries(HOSTILE.name) if (k, n) == at), None)


def _is_bytes_handle(result: Any) -> bool:
    """True for a heap snapshot result whose file is in memory (not RocksDB's)."""
    return isinstance(getattr(result, "handle", None), io.BytesIO)


class GatedSerializer(DefaultSerializer):
    """The default serializer (same identifier, same bytes) whose ``serialize``,
    off the owner's thread, first passes the write gate: an asynchronous writer
    lets the owner run one operation between reading a state and serializing
    it. While a writer waits there, ``waiting`` is set and ``reading`` is the
    state object it is about to serialize."""

    __slots__ = ("_gate", "_owner", "reading", "waiting")

    def __init__(self, gate: WriteGate, owner: int) -> None:
        self._gate = gate
        self._owner = owner
        self.reading: Any = None
        self.waiting = threading.Event()

    def serialize(self, state: Any) -> bytes:
        if threading.get_ident() != self._owner:
            self.reading = state
            self.waiting.set()
            try:
                self._gate.pass_through()
            finally:
                self.waiting.clear()
                self.reading = None
        return DefaultSerializer.serialize(state)


def gated_descriptors(serializer: GatedSerializer) -> dict[str, StateDescriptor]:
    """:data:`DESCRIPTORS` with ``serializer`` as every state's serializer."""
    return {name: dataclasses.replace(d, serializer=serializer) for name, d in DESCRIPTORS.items()}


class ChangeTracking(BackendMachine):
    """The backend machine over a backend whose maps track changes
    (``implementation.tracks_changes``: rules T and D of
    :mod:`cowstate.state_map`), with every kind's handles writing through them.

    ``take_base`` snapshots every state's key-group maps at once and releases
    them (a checkpoint already written), recording each map, its snapshot
    version and the model's contents, and trims the removal logs to it. After
    every step, for every state: a mapping the model holds that the base
    lacks or holds with another state is among its map's changed mappings
    (``state_version >= base``), and a key of the base the model lacks is
    among its map's ``removals_since(base)`` unless the map says it cannot
    tell (its log overflowed: ``tracking_since > base``). A restore replaces
    the maps: the base is dropped then.
    """

    base: dict[str, tuple[dict[int, tuple[Any, int]], dict[tuple[Any, Any], Any]]] | None = None

    @rule()
    def take_base(self) -> None:
        self.gate.tick()
        base = {}
        for name in DESCRIPTORS:
            table = self.backend.table(name)
            assert isinstance(table, StateTable)
            maps: dict[int, tuple[Any, int]] = {}
            for key_group in table.key_group_range:
                m: Any = table.state_map(key_group)  # a map that tracks changes
                snap = m.snapshot()
                maps[key_group] = (m, snap.version)
                snap.release()
                m.trim_removals(snap.version)
            base[name] = (maps, copy.deepcopy(self.model.contents(name)))
        self.base = base

    @invariant()
    def changes_are_tracked(self) -> None:
        if self.base is None:
            return
        for name, (maps, then) in self.base.items():
            table = self.backend.table(name)
            if not isinstance(table, StateTable) or any(
                table.state_map(kg) is not m for kg, (m, _) in maps.items()
            ):
                self.base = None  # restored: other maps, no base
                return
            now = self.model.contents(name)
            for kn, state in now.items():
                if kn in then and then[kn] == state:
                    continue
                m, version = maps[table.key_group_of(kn[0])]
                assert kn in changed_keys(m, version), (
                    f"{name}: {kn!r} changed since the base ({then.get(kn)!r} -> {state!r}) "
                    f"but its map does not track it"
                )
            for kn in then:
                if kn in now:
                    continue
                m, version = maps[table.key_group_of(kn[0])]
                removed = m.removals_since(version)
                if removed is None:
                    assert m.tracking_since > version, f"{name}: removals lost, yet tracking"
                else:
                    assert kn in removed, (
                        f"{name}: {kn!r} removed since the base but not among its map's "
                        f"removals {removed!r}"
                    )


def backend_machine_for(
    implementation: BackendImplementation,
    key_group_range: KeyGroupRange,
    *,
    hostile: bool = False,
) -> type[BackendMachine]:
    """The backend machine class for ``implementation`` over ``key_group_range``
    (with :class:`HostileUserCode`'s rule if ``hostile``; with
    :class:`ChangeTracking`'s where the implementation tracks changes)."""
    base: type[BackendMachine] = HostileUserCode if hostile else BackendMachine
    bases: tuple[type[BackendMachine], ...] = (base,)
    if implementation.tracks_changes:
        bases = (ChangeTracking, base)
    return type(
        f"{base.__name__}[{implementation.name}, {key_group_range!r}]",
        bases,
        {"implementation": implementation, "key_group_range": key_group_range},
    )
