"""The state machine: an implementation and the reference model, side by side.

One rule per operation of the public API, named as the operation; the
contract (README.md, "The contract"; its meaning is :mod:`cowstate_model`) is
in the rules and the invariants:

- every result, size, iteration (as a multiset) and key set per namespace
  equals the model's;
- a state returned by ``get`` is mutated in place by the caller (the rule
  ``get_and_mutate``) -- allowed until the next snapshot;
- every open snapshot yields, after every step, exactly the model's deep copy
  taken when it was opened;
- bad input (``None`` states, unhashable keys, failing transform functions)
  raises a ``cowstate.errors`` exception exactly when the model refuses it,
  and changes nothing;
- with ``machine_for(..., hostile=True)`` (:class:`HostileUserCode`), hostile
  user code (rule U of ``cowstate.state_map``, the objects of
  :mod:`cowstate_spec.hostile`) -- a probe key or namespace whose ``__hash__``
  or ``__eq__`` raises, a stored state whose ``__deepcopy__`` raises while
  armed, a state nested deeper than a deep copy can go, a transform function
  that mutates its argument and then raises -- raises the documented error
  chained from the cause, and the contents equal the model's afterwards
  (for the transform: plus the function's in-place change exactly when the
  implementation handed it the stored object, which it must when no snapshot
  is open and its mutations persist); a probe whose first ``__eq__`` puts
  mappings into the implementation itself (rule R) is looked up in the map
  as those puts left it, and the model gets the same puts;
- the implementation's structural checker holds after every step;
- (maps) a state object the implementation held and maps no more is
  collected once no snapshot is open (:mod:`cowstate_spec.collected`: the
  states a map is given are weak-referenceable copies), so a leaked
  reference fails the step that leaked it.

Where an implementation legitimately departs from this (its
:class:`~cowstate_spec.implementations.Capabilities`), the rule consults the
flag and checks what it does instead: without ``snapshots`` no snapshot is
taken; without ``put_reports_insert`` ``put`` must return ``None``; without
``mutations_persist`` a state ``get`` returned is mutated on the
implementation's side only, so the next ``get`` proves the mutation reached
nothing stored.

Some rules aim at the rare paths (:mod:`cowstate_spec.coverage` records each
as a Hypothesis event): ``put_many`` grows the map within a run; a snapshot
rule enabled only during a rehash, and one that grows the map into a rehash
(``grow_into_a_rehash``, up to ``GROWTH_LIMIT`` mappings) and steps it past
three quarters before it snapshots; releases of any snapshot but the oldest;
rule S rules on a mapping the newest open snapshot holds (``get``,
``put_and_get_old``, ``remove_and_get_old``, ``transform``); an iterator
interrupted by a keyed operation's rehash step must fail fast, and a ``get``
of a mapping in the bucket where its own rehash step stops (the first still
in the old table: ``mappings_at_the_rehash_boundary``) must find it -- both
rules grow the map into a rehash first. Only the machines whose paths are counted
(``coverage.COUNTED``) read the structure around every keyed operation.
Others back the catches of :mod:`cowstate_spec.bad_implementations`: a
``remove``, then ``get`` and mutate every mapping while a snapshot is open
(after rule E copies), an
iterator across a ``remove`` or ``put`` that must fail fast, and (tables)
keys beyond the Basic Multilingual Plane, which Java hashes as two UTF-16
units.

State tables (``implementation.table``) get :class:`StateTableMachine`: the
same rules against the reference table of the same key groups, plus the
key-group rules -- operations with an explicit key group, a key group
outside the table (refused), per-key-group snapshot contents and releases,
and the live mappings of each key group (routing).

``machine_for(implementation)`` returns the ``RuleBasedStateMachine`` class
for one implementation of :mod:`cowstate_spec.implementations`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from cowstate.arithmetic import MIN_TRANSFERRED_PER_INCREMENTAL_REHASH
from cowstate.errors import (
    KeyComparisonError,
    KeyHashError,
    StateCopyError,
    StateTooDeepError,
    TransformFunctionError,
)
from cowstate.state_table import CopyOnWriteStateTable, StateTable
from cowstate_model import ReferenceStateMap
from cowstate_spec import contract as c
from cowstate_spec import coverage as cov
from cowstate_spec import strategies as s
from cowstate_spec.cmap_view import MAP_CLASSES, states_held_by_views, view_of
from cowstate_spec.collected import Lifetimes, tracked
from cowstate_spec.contract import snapshot_contents
from cowstate_spec.hostile import (
    CopyTrapList,
    MutateThenRaise,
    ReentrantKey,
    TrapKey,
    Trapped,
    armed,
    deep_state,
)
from cowstate_spec.implementations import Implementation
from cowstate_spec.invariants import changed_keys
from cowstate_spec.keys import typed_keys

__all__ = [
    "ChangeTracking",
    "HostileUserCode",
    "StateMapMachine",
    "StateTableMachine",
    "machine_for",
    "snapshot_contents",
]


#: Operations on one mapping: each performs a rehash step (invariant 9).
KEYED_OPERATIONS = frozenset(
    {"get", "contains_key", "put", "put_and_get_old", "remove", "remove_and_get_old", "transform"}
)

#: The keyed operations' arguments after ``(key, namespace)``, for the rules of
#: hostile user code.
HOSTILE_CALLS: dict[str, tuple[Any, ...]] = {
    "get": (),
    "contains_key": (),
    "put": ([7],),
    "put_and_get_old": ([7],),
    "remove": (),
    "remove_and_get_old": (),
    "transform": (7, c.add_or_append),
}
#: The operation that hands out a stored state (rule S copies it first) in
#: place of each keyed operation, for the cases about copies.
HANDING_OUT = {
    "get": "get",
    "contains_key": "get",
    "put": "put_and_get_old",
    "put_and_get_old": "put_and_get_old",
    "remove": "remove_and_get_old",
    "remove_and_get_old": "remove_and_get_old",
    "transform": "transform",
}
#: The cases of ``hostile_user_code`` (its ``hostile_<case>`` methods).
HOSTILE_CASES = (
    "key_hash",
    "key_equality",
    "transform",
    "state_copy",
    "deep_state",
    "reentrant_key",
)

#: The keys a re-entrant probe puts (strings: a table admits any of them
#: whatever number type its first key fixed).
REENTRANT_KEYS = tuple(f"re{i}" for i in range(64))


#: ``grow_into_a_rehash`` stops at this many mappings: rehashes of 4, 8 and 16
#: buckets (each reaches r >= 3L/4 in a step or two) without the larger maps
#: that would make every later step's checks slower.
GROWTH_LIMIT = 24


class Outcome:
    """What one call did: returned a value, or raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        try:
            self.value = call()
        except Exception as exc:
            self.error = exc

    def __str__(self) -> str:
        return f"raised {self.error!r}" if self.error else f"returned {self.value!r}"


class StateMapMachine(RuleBasedStateMachine):
    """Drives ``implementation`` and the model with the same operations."""

    implementation: Implementation

    #: Composite keys that were put: operations pick them half of the time,
    #: so gets, removes and mutations hit mapped keys (and shared entries).
    mappings = Bundle("mappings")
    any_key = st.one_of(mappings, s.composite_keys)

    def __init__(self) -> None:
        super().__init__()
        self.impl = self.implementation.create()
        self.model = self.implementation.model()
        # (implementation snapshot, model snapshot, fingerprint or None)
        self.open: list[tuple[Any, Any, Any]] = []
        self.rehash_seen = (False, False)  # (rehashing, late in it): note_the_rehash
        # Only the machines whose rare paths are counted read the structure around
        # each keyed operation (cowstate_spec.coverage.COUNTED): it costs a quarter.
        self.counted = self.implementation.name in cov.COUNTED
        self.can_rehash = self.implementation.capabilities.snapshots and self.has_cow_maps()
        # The maps' state lifetimes (tables: their maps are the map machines' to
        # watch), where the implementation promises them (frees_states).
        self.lifetimes = (
            None
            if self.implementation.table or not self.implementation.capabilities.frees_states
            else Lifetimes(lambda: states_held_by_views(self.impl))
        )
        # ChangeTracking: the keys a keyed operation named since the base (None: no base)
        self.touched: set[tuple[Any, Any]] | None = None
        self.base: tuple[int, dict[tuple[Any, Any], Any]] | None = None

    # ------------------------------------------------------------- helpers

    def both(self, operation: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Apply ``operation`` to both; they must agree on success or failure.

        The model gets its own deep copy of the arguments, so no state object
        is ever shared between the two sides. A map is given a list or dict
        state as a tracked copy, whose lifetime the machine watches
        (``states_nothing_holds_are_collected``).
        """
        if self.lifetimes is not None and operation in ("put", "put_and_get_old"):
            state = tracked(args[2])
            self.lifetimes.record(state)
            args = (args[0], args[1], state, *args[3:])
        model_args = copy.deepcopy(args)
        step_check = self.implementation.step_check
        keyed = operation in KEYED_OPERATIONS
        after = step_check(self.impl) if step_check and keyed else None
        observed = (
            self.map_of(args[0], kwargs.get("key_group"))
            if keyed and self.open and self.counted
            else None
        )
        before = cov.MapState(observed) if observed is not None else None
        if keyed and self.touched is not None:  # what changes may be tracked since a base
            with contextlib.suppress(Exception):  # an unhashable or hostile probe
                self.touched.add((args[0], args[1]))
        impl = Outcome(lambda: getattr(self.impl, operation)(*args, **kwargs))
        if after is not None and impl.error is None:
            after()  # invariant 9: the rehash moved on
        if before is not None and impl.error is None:
            kn = (args[0], args[1])
            cov.record_keyed_operation(operation, kn, before, cov.MapState(observed))
        model = Outcome(lambda: getattr(self.model, operation)(*model_args, **kwargs))
        call = f"{operation}{args!r}{kwargs or ''}"
        assert (impl.error is None) == (model.error is None), (
            f"{call}: implementation {impl}, model {model}"
        )
        if impl.error is not None and not isinstance(self.impl, ReferenceStateMap):
            refusals = self.implementation.capabilities.refusals
            assert isinstance(impl.error, refusals), (
                f"{call} raised {impl.error!r}, expected a refusal "
                f"({', '.join(r.__name__ for r in refusals)})"
            )
        return impl.value, model.value

    def map_of(self, key: Any, key_group: int | None = None) -> Any:
        """The copy-on-write map that holds ``key`` (None: no such map, or a
        key without one), whose structure the coverage events read."""
        if isinstance(self.impl, MAP_CLASSES):
            return self.impl
        return None

    def equal_results(self, operation: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        impl, model = self.both(operation, *args, **kwargs)
        assert impl == model, f"{operation}{args!r}: implementation {impl!r}, model {model!r}"
        return impl, model

    # --------------------------------------------------------------- rules

    def put_checked(self, kn: tuple[Any, Any], state: Any, **kwargs: Any) -> None:
        """``put`` on both: True exactly when the mapping is new, or ``None``
        from an implementation that does not report it."""
        if self.implementation.capabilities.put_reports_insert:
            self.equal_results("put", *kn, state, **kwargs)
        else:
            impl, _ = self.both("put", *kn, state, **kwargs)
            assert impl is None, f"put{kn!r} returned {impl!r}, expected None"

    def caller_mutates(self, impl: Any, model: Any, item: int, *, got: bool = False) -> None:
        """A caller mutates a state the implementation handed out; the model's
        state follows, except a state ``get`` returned (``got``) from an
        implementation whose mutations do not persist: that one is a fresh
        copy, so mutating it must change nothing stored."""
        persists = not got or self.implementation.capabilities.mutations_persist
        if c.mutate_in_place(impl, item) and persists:
            c.mutate_in_place(model, item)

    @rule(target=mappings, kn=any_key, state=s.states)
    def put(self, kn: tuple[Any, Any], state: Any) -> tuple[Any, Any]:
        self.put_checked(kn, state)
        return kn

    @rule(
        target=mappings,
        start=st.integers(0, len(s.MANY_KEYS) - 1),
        count=st.integers(2, 8),
        namespace=s.namespaces,
        state=s.states,
    )
    def put_many(
        self, start: int, count: int, namespace: Any, state: Any
    ) -> MultipleResults[tuple[Any, Any]]:
        """``count`` puts in one step, of consecutive keys of ``MANY_KEYS`` from
        ``start`` (wrapping): the map grows (and rehashes) within a run."""
        kns = [(s.MANY_KEYS[(start + i) % len(s.MANY_KEYS)], namespace) for i in range(count)]
        for kn in kns:
            self.put_checked(kn, copy.deepcopy(state))
        return multiple(*kns)

    @rule(kn=any_key)
    def get(self, kn: tuple[Any, Any]) -> None:
        self.equal_results("get", *kn)

    @rule(kn=any_key, item=st.integers(0, 99))
    def get_and_mutate(self, kn: tuple[Any, Any], item: int) -> None:
        self.caller_mutates(*self.equal_results("get", *kn), item, got=True)

    @rule(kn=any_key)
    def contains_key(self, kn: tuple[Any, Any]) -> None:
        self.equal_results("contains_key", *kn)

    @rule(kn=any_key, state=s.states, item=st.integers(0, 99))
    def put_and_get_old(self, kn: tuple[Any, Any], state: Any, item: int) -> None:
        # The old state is the caller's now: mutating it must not reach a snapshot.
        self.caller_mutates(*self.equal_results("put_and_get_old", *kn, state), item)

    @rule(kn=any_key)
    def remove(self, kn: tuple[Any, Any]) -> None:
        self.equal_results("remove", *kn)

    @rule(kn=any_key, item=st.integers(0, 99))
    def remove_and_get_old(self, kn: tuple[Any, Any], item: int) -> None:
        self.caller_mutates(*self.equal_results("remove_and_get_old", *kn), item)

    @rule(kn=any_key, value=st.integers(0, 9), fn=s.transform_functions)
    def transform(self, kn: tuple[Any, Any], value: int, fn: Callable[[Any, int], Any]) -> None:
        self.both("transform", *kn, value, fn)

    @precondition(lambda self: self.implementation.capabilities.snapshots)
    @rule()
    def snapshot(self) -> None:
        self.record_snapshot()
        impl = self.impl.snapshot()
        model = self.model.snapshot()
        fp = self.implementation.fingerprint(impl) if self.implementation.fingerprint else None
        self.open.append((impl, model, fp))

    @precondition(lambda self: self.implementation.capabilities.snapshots and self.rehashing())
    @rule()
    def snapshot_in_a_rehash(self) -> None:
        """The same as ``snapshot``, enabled only while a rehash runs: a second
        chance for the rare moment the compact layout is about."""
        self.snapshot()

    @precondition(lambda self: self.can_rehash)
    @rule(target=mappings, start=st.integers(0, len(s.MANY_KEYS) - 1), kn=any_key)
    def snapshot_late_in_a_rehash(
        self, start: int, kn: tuple[Any, Any]
    ) -> MultipleResults[tuple[Any, Any]]:
        """Outside a rehash, puts until one starts (``grow_into_a_rehash``); then
        ``contains_key(kn)`` until the rehash index is past three quarters of the
        old table (each call is a rehash step; at most 8), then the same as
        ``snapshot`` if the rehash still runs (the layout's moved high half is
        large): a step rarely stops there by itself. A table's maps are not
        advanced (which one a key reaches is the table's business)."""
        kns = self.grow_into_a_rehash(start, kn[1])
        for _ in range(0 if self.implementation.table else 8):
            if not self.rehashing() or self.late_in_rehash():
                break
            self.equal_results("contains_key", *kn)
            self.rehash_seen = self.read_rehash()
        if self.rehashing():
            self.snapshot()
        return multiple(*kns)

    def grow_into_a_rehash(self, start: int, namespace: Any) -> list[tuple[Any, Any]]:
        """Unless the map rehashes: puts of consecutive keys of ``MANY_KEYS``
        from ``start`` until it starts a rehash (or every key is in, or the
        map holds ``GROWTH_LIMIT`` mappings); the mappings put. The rules that
        need a running rehash call it, so they are enabled in every step
        instead of the few a rehash runs in."""
        kns: list[tuple[Any, Any]] = []
        for i in range(len(s.MANY_KEYS)):
            if self.rehashing() or len(self.model) >= GROWTH_LIMIT:
                break
            kn = (s.MANY_KEYS[(start + i) % len(s.MANY_KEYS)], namespace)
            self.put_checked(kn, [i])
            kns.append(kn)
            self.rehash_seen = self.read_rehash()
        return kns

    @precondition(lambda self: len(self.open) >= 1)
    @rule(index=st.integers(0, 7))
    def release_out_of_order(self, index: int) -> None:
        """``release`` of any open snapshot but the oldest, with others open (a
        snapshot is taken first if only one is open)."""
        if len(self.open) < 2:
            self.snapshot()
        self.release(1 + index % (len(self.open) - 1))

    # Rule S on a mapped key while a snapshot is open: the rules that hand out
    # states, on a mapping the newest snapshot holds (``choice`` picks it; the
    # put mapping ``kn`` when it holds none). A put mapping has often been
    # written since the snapshot: drawn from the bundle alone, rule S on
    # put_and_get_old and transform was reached a handful of times per run.

    @precondition(lambda self: bool(self.open))
    @rule(kn=mappings, choice=st.integers(0, 255), item=st.integers(0, 99))
    def get_and_mutate_shared(self, kn: tuple[Any, Any], choice: int, item: int) -> None:
        self.get_and_mutate(self.held_by_newest_snapshot(choice, kn), item)

    @precondition(lambda self: bool(self.open))
    @rule(kn=mappings, choice=st.integers(0, 255), state=s.states, item=st.integers(0, 99))
    def put_and_get_old_shared(
        self, kn: tuple[Any, Any], choice: int, state: Any, item: int
    ) -> None:
        self.put_and_get_old(self.held_by_newest_snapshot(choice, kn), state, item)

    @precondition(lambda self: bool(self.open))
    @rule(kn=mappings, choice=st.integers(0, 255), item=st.integers(0, 99))
    def remove_and_get_old_shared(self, kn: tuple[Any, Any], choice: int, item: int) -> None:
        self.remove_and_get_old(self.held_by_newest_snapshot(choice, kn), item)

    @precondition(lambda self: bool(self.open))
    @rule(
        kn=mappings,
        choice=st.integers(0, 255),
        value=st.integers(0, 9),
        fn=s.succeeding_transform_functions,
    )
    def transform_shared(
        self, kn: tuple[Any, Any], choice: int, value: int, fn: Callable[[Any, int], Any]
    ) -> None:
        self.transform(self.held_by_newest_snapshot(choice, kn), value, fn)

    @precondition(lambda self: bool(self.open))
    @rule(index=st.integers(0, 7))
    def release(self, index: int) -> None:
        impl, model, _ = self.pop_open(index)
        assert snapshot_contents(impl) == model.contents, (
            f"snapshot {_version(impl)} differs from the model's at release"
        )
        expected = typed_keys((k, n, st) for (k, n), st in model.contents.items())
        assert typed_keys(impl) == expected, f"snapshot {_version(impl)}: keys differ by type"
        impl.release()
        model.release()
        assert getattr(impl, "is_released", True)

    def rehashing(self) -> bool:
        """True while the implementation's copy-on-write map is rehashing (as of
        the end of the last step: see ``note_the_rehash``)."""
        return self.rehash_seen[0]

    def late_in_rehash(self) -> bool:
        """True while the map rehashes with the index at 3/4 of the old table or
        later (as of the end of the last step)."""
        return self.rehash_seen[1]

    def has_cow_maps(self) -> bool:
        """True where the implementation is a copy-on-write map (its rehash is visible)."""
        return isinstance(self.impl, MAP_CLASSES)

    def read_rehash(self) -> tuple[bool, bool]:
        """(rehashing, late in the rehash), read from the map's structure."""
        if not isinstance(self.impl, MAP_CLASSES):
            return (False, False)
        return cov.rehash_state(self.impl)

    def record_snapshot(self) -> None:
        if isinstance(self.impl, MAP_CLASSES):
            cov.record_snapshot(self.impl)

    def held_by_newest_snapshot(self, choice: int, otherwise: tuple[Any, Any]) -> tuple[Any, Any]:
        """Mapping ``choice`` (modulo) of the newest open snapshot, by the model;
        ``otherwise`` if it holds none or a key group of it was released."""
        try:
            held = [(e.key, e.namespace) for e in self.open[-1][1]]
        except RuntimeError:  # a table snapshot with a released key group
            return otherwise
        return held[choice % len(held)] if held else otherwise

    def pop_open(self, index: int) -> tuple[Any, Any, Any]:
        """Take the open snapshot ``index`` (modulo) off the list, oldest first."""
        index %= len(self.open)
        if index > 0:
            cov.record(cov.RELEASE_OUT_OF_ORDER)
        return self.open.pop(index)

    @rule()
    def iterate(self) -> None:
        assert snapshot_contents(self.impl) == snapshot_contents(self.model)
        # Equal keys of other types are one mapping whose key is the first put (a dict's).
        assert typed_keys(self.impl) == typed_keys(self.model), "keys differ by type"

    @precondition(lambda self: self.can_rehash and not self.implementation.table)
    @rule(
        target=mappings,
        start=st.integers(0, len(s.MANY_KEYS) - 1),
        kn=any_key,
        taken=st.integers(0, 3),
    )
    def iterate_across_a_rehash_step(
        self, start: int, kn: tuple[Any, Any], taken: int
    ) -> MultipleResults[tuple[Any, Any]]:
        """Outside a rehash, puts until one starts (``grow_into_a_rehash``); then
        an iterator and a keyed operation (its rehash step relinks entries):
        the iterator must fail fast, having yielded only live mappings."""
        kns = self.grow_into_a_rehash(start, kn[1])
        if self.rehashing():
            self.iterate_across_the_step(kn, taken)
        return multiple(*kns)

    @precondition(lambda self: self.can_rehash and not self.implementation.table)
    @rule(
        target=mappings,
        start=st.integers(0, len(s.MANY_KEYS) - 1),
        kn=any_key,
        choice=st.integers(0, 255),
    )
    def get_at_the_rehash_boundary(
        self, start: int, kn: tuple[Any, Any], choice: int
    ) -> MultipleResults[tuple[Any, Any]]:
        """Outside a rehash, puts until one starts (``grow_into_a_rehash``);
        then ``get`` of a mapping in the bucket where the get's own rehash step
        will stop (``mappings_at_the_rehash_boundary``): the first bucket
        still in the old table, the one an off-by-one table selection seeks
        in the new one. One step, so the rehash is not used up."""
        kns = self.grow_into_a_rehash(start, kn[1])
        if self.rehashing():
            boundary = mappings_at_the_rehash_boundary(self.impl)
            if boundary:
                self.equal_results("get", *boundary[choice % len(boundary)])
        return multiple(*kns)

    def iterate_across_the_step(self, kn: tuple[Any, Any], taken: int) -> None:
        live = {(k, n) for k, n, _ in self.impl}
        iterator = iter(self.impl)
        seen = [(k, n) for k, n, _ in itertools.islice(iterator, taken)]
        assert set(seen) <= live and len(seen) == len(set(seen)), (
            f"iteration yielded {seen!r}, the map holds {live!r}"
        )
        self.equal_results("contains_key", *kn)
        outcome = Outcome(lambda: list(iterator))
        failure = self.implementation.capabilities.concurrent_modification
        assert isinstance(outcome.error, failure), (
            f"iteration across a rehash step {outcome}, expected {failure.__name__}"
        )
        cov.record(cov.ITERATION_INTERRUPTED_BY_REHASH)

    @rule(namespace=s.namespaces)
    def keys(self, namespace: Any) -> None:
        impl = Counter(self.impl.keys(namespace))
        model = Counter(self.model.keys(namespace))
        assert impl == model, f"keys({namespace!r}): implementation {impl}, model {model}"
        self.equal_results("size_of_namespace", namespace)

    # ------------------------------------------------------- bad input rules

    @rule(kn=any_key)
    def put_none(self, kn: tuple[Any, Any]) -> None:
        if self.implementation.capabilities.refuses_none:
            self.both("put", *kn, None)

    @rule(bad=s.unhashables, key=s.keys, as_key=st.booleans())
    def put_unhashable(self, bad: Any, key: Any, as_key: bool) -> None:
        args = (bad, 0) if as_key else (key, bad)
        self.both("put", *args, 1)
        self.both("get", *args)

    # ----------------------------------------- hostile user code (rule U)

    def user_code_target(self, kn: tuple[Any, Any]) -> dict[str, Any] | None:
        """The keyword arguments that address ``kn`` with a probe in place of its
        key (a table's: the key's own key group), or None where the rules of
        hostile user code do not apply (the reference model)."""
        return {} if isinstance(self.impl, MAP_CLASSES) else None

    def own_key_group(self, key: Any) -> int | None:
        """The key group a table routes ``key`` to (a map has none: None)."""
        return None

    def compares_keys(self) -> bool:
        """Whether the implementation compares keys with ``__eq__`` (not RocksDB's bytes)."""
        return isinstance(self.impl, MAP_CLASSES)

    def copies_shared_states(self) -> bool:
        """Whether rule S copies a state a snapshot holds before handing it out
        (the nested table copies every state at ``snapshot()`` instead)."""
        return isinstance(self.impl, MAP_CLASSES)

    def mapped(self, kn: tuple[Any, Any], **kwargs: Any) -> bool:
        return Outcome(lambda: self.model.contains_key(*kn, **kwargs)).value is True

    def peek(self, kn: tuple[Any, Any]) -> Any:
        """The state the implementation maps ``kn`` to (None: absent), read by
        iterating: no rule S copy, the stored object itself."""
        key, namespace = kn  # HashKeys of one value but other hashes are ==: hash first
        h = (hash(key), hash(namespace))
        return next(
            (
                state
                for k, n, state in self.impl
                if (hash(k), hash(n)) == h and k == key and n == namespace
            ),
            None,
        )

    def refused(
        self, call: Callable[[], Any], error: type[Exception], cause: type[BaseException]
    ) -> None:
        """``call`` raises ``error`` chained from a ``cause``; the contents are the model's."""
        outcome = Outcome(call)
        assert isinstance(outcome.error, error) and isinstance(outcome.error.__cause__, cause), (
            f"{outcome}, expected {error.__name__} from {cause.__name__}"
        )
        self.contents_agree()

    def contents_agree(self) -> None:
        impl, model = snapshot_contents(self.impl), snapshot_contents(self.model)
        assert impl == model, f"contents: implementation {impl!r}, model {model!r}"

    def hostile_key_hash(
        self, kn: tuple[Any, Any], op: str, as_key: bool, value: int, kwargs: dict[str, Any]
    ) -> None:
        """A probe whose ``__hash__`` raises: KeyHashError."""
        probe = TrapKey("probe", 0, 0, "hash")
        args = (probe, kn[1]) if as_key else (kn[0], probe)
        call = functools.partial(getattr(self.impl, op), *args, *HOSTILE_CALLS[op], **kwargs)
        self.refused(call, KeyHashError, Trapped)

    def hostile_key_equality(
        self, kn: tuple[Any, Any], op: str, as_key: bool, value: int, kwargs: dict[str, Any]
    ) -> None:
        """A probe hashing as a mapped key (or namespace): the implementation
        must compare it with that one, and the comparison raises."""
        if not self.compares_keys() or not self.mapped(kn, **kwargs):
            return
        key, namespace = kn
        if as_key:
            key = TrapKey("probe", 0, hash(key), "eq")
        else:
            namespace = TrapKey("probe", 0, hash(namespace), "eq")
        call = functools.partial(
            getattr(self.impl, op), key, namespace, *HOSTILE_CALLS[op], **kwargs
        )
        self.refused(call, KeyComparisonError, Trapped)

    def hostile_transform(
        self, kn: tuple[Any, Any], op: str, as_key: bool, value: int, kwargs: dict[str, Any]
    ) -> None:
        """The transform contract: TransformFunctionError, the same state object
        mapped, the function's in-place change kept exactly when it was given
        the stored object (which it must be when no snapshot is open)."""
        had = self.mapped(kn, **kwargs)
        before = self.peek(kn)
        fn = MutateThenRaise()
        outcome = Outcome(lambda: self.impl.transform(*kn, value, fn, **kwargs))
        assert isinstance(outcome.error, TransformFunctionError), (
            f"transform{kn!r} with a function that mutates then raises {outcome}"
        )
        assert fn.called and isinstance(outcome.error.__cause__, Trapped)
        after = self.peek(kn)
        if not had:
            assert fn.received is None and after is None, f"{kn!r} was absent: {after!r}"
            return
        if self.implementation.capabilities.mutations_persist:
            assert after is before, f"{kn!r} maps another state object after a failed transform"
            if not self.open:
                assert fn.received is before, "no snapshot open: transform must hand out the state"
        if fn.received is after:  # the stored object was changed in place: the model follows
            c.mutate_in_place(self.model.get(*kn, **kwargs), value)
        self.contents_agree()

    def hostile_reentrant_key(
        self, kn: tuple[Any, Any], op: str, as_key: bool, value: int, kwargs: dict[str, Any]
    ) -> None:
        """A probe hashing as a mapped key (or namespace), so the implementation
        compares it with that one, whose first ``__eq__`` puts ``8 + 4 * value``
        mappings into the implementation (its table: into the probe's key
        group), enough to start or step a rehash (rule R of
        ``cowstate.state_map``). The operation must act on the map as those
        puts left it: the probe is absent, so a reading operation finds
        nothing and a writing one maps it, where it is then found and
        unmapped again. The model gets the same puts."""
        if not self.compares_keys() or not self.mapped(kn, **kwargs):
            return
        key_group = kwargs.get("key_group")
        extra = [
            (k, kn[1])
            for k in REENTRANT_KEYS
            if key_group is None or self.own_key_group(k) == key_group
        ][: 8 + 4 * value]

        def reenter() -> None:
            for k, n in extra:
                self.impl.put(k, n, value, **kwargs)

        key, namespace = kn
        if as_key:
            key = ReentrantKey("probe", 0, hash(key), reenter)
        else:
            namespace = ReentrantKey("probe", 0, hash(namespace), reenter)
        outcome = Outcome(
            lambda: getattr(self.impl, op)(key, namespace, *HOSTILE_CALLS[op], **kwargs)
        )
        probe = key if as_key else namespace
        assert probe.fired, f"{op}: the probe hashing as {kn!r} was never compared"
        for k, n in extra:
            self.model.put(k, n, value, **kwargs)
        inserts = op in ("put", "put_and_get_old", "transform")
        expected: Any = {"contains_key": False, "put": True}.get(op)
        if op == "put" and not self.implementation.capabilities.put_reports_insert:
            expected = None
        assert outcome.error is None and outcome.value == expected, (
            f"{op}{(key, namespace)!r} with a probe that puts {len(extra)} mappings "
            f"{outcome}, expected {expected!r}"
        )
        if inserts:  # put and put_and_get_old map [7], transform add_or_append(None, 7)
            found = Outcome(lambda: self.impl.get(key, namespace, **kwargs))
            assert found.value == [7], f"get of the probe just mapped {found}"
            gone = Outcome(lambda: self.impl.remove_and_get_old(key, namespace, **kwargs))
            assert gone.value == [7], f"remove_and_get_old of the probe {gone}"
        self.contents_agree()

    def hostile_state_copy(
        self, kn: tuple[Any, Any], op: str, as_key: bool, value: int, kwargs: dict[str, Any]
    ) -> None:
        """A stored state whose deep copy raises (armed): rule S's copy (or the
        nested table's snapshot) raises StateCopyError and changes nothing.
        The state stays mapped and copies normally afterwards."""
        if not self.implementation.capabilities.snapshots or len(self.open) >= 4:
            return
        self.put_checked(kn, CopyTrapList([value]), **kwargs)
        if self.copies_shared_states():
            self.snapshot()
            op = HANDING_OUT[op]
            call = functools.partial(getattr(self.impl, op), *kn, *HOSTILE_CALLS[op], **kwargs)
        else:
            call = self.impl.snapshot
        with armed():
            self.refused(call, StateCopyError, Trapped)

    def hostile_deep_state(
        self, kn: tuple[Any, Any], op: str, as_key: bool, value: int, kwargs: dict[str, Any]
    ) -> None:
        """A state nested deeper than a deep copy can go: storing and removing it
        work; copying it (rule S, the nested table's snapshot) raises
        StateTooDeepError (a RecursionError) and changes nothing. The deep
        state is the implementation's only, so the rule puts back what it
        replaced before it ends."""
        if not self.implementation.capabilities.snapshots:
            return
        had = self.mapped(kn, **kwargs)
        old = copy.deepcopy(self.model.get(*kn, **kwargs)) if had else None
        deep = deep_state()
        self.impl.put(*kn, deep, **kwargs)
        if not had:  # the model stores the key too: a table's first key of a domain fixes its type
            self.model.put(*kn, 0, **kwargs)
            self.model.remove(*kn, **kwargs)
        if self.copies_shared_states():
            op = HANDING_OUT[op]
            snapshot = self.impl.snapshot()
            outcome = Outcome(lambda: getattr(self.impl, op)(*kn, *HOSTILE_CALLS[op], **kwargs))
            snapshot.release()
            assert isinstance(outcome.error, StateTooDeepError), f"{op}{kn!r} {outcome}"
            assert self.peek(kn) is deep, f"{op}{kn!r} unmapped or replaced a deep state"
        else:
            outcome = Outcome(self.impl.snapshot)
        assert isinstance(outcome.error, StateTooDeepError), f"snapshot() {outcome}"
        assert isinstance(outcome.error, RecursionError)
        assert isinstance(outcome.error.__cause__, RecursionError)
        if had:
            self.impl.put(*kn, old, **kwargs)
        else:
            self.impl.remove(*kn, **kwargs)
        self.contents_agree()

    # ------------------------------------------------------------ invariants

    @invariant()
    def note_the_rehash(self) -> None:
        """Not a check: reads once per step whether a rehash runs, for the
        preconditions of the rules that aim at it (a C map's structure export
        per precondition would cost more than the step)."""
        self.rehash_seen = self.read_rehash()

    @invariant()
    def sizes_agree(self) -> None:
        assert len(self.impl) == len(self.model), (
            f"size: implementation {len(self.impl)}, model {len(self.model)}"
        )

    @invariant()
    def open_snapshots_never_change(self) -> None:
        for impl, model, _ in self.open:
            assert len(impl) == len(model), (
                f"snapshot {_version(impl)}: size {len(impl)}, model {len(model)}"
            )
            assert snapshot_contents(impl) == model.contents, (
                f"snapshot {_version(impl)} changed: {snapshot_contents(impl)!r} != "
                f"{dict(model.contents)!r}"
            )

    @invariant()
    def states_nothing_holds_are_collected(self) -> None:
        if self.lifetimes is not None:
            self.lifetimes.check((state for _, _, state in self.impl), bool(self.open))

    @invariant()
    def structure_holds(self) -> None:
        if self.implementation.check is not None:
            self.implementation.check(self.impl, [fp for _, _, fp in self.open if fp is not None])

    # ------------------------------------- rules that back the bad maps' catches
    # (cowstate_spec.bad_implementations: each defect class caught by a rule,
    # not only by a scenario test)

    @precondition(
        lambda self: bool(self.open) and not self.rehashing() and not self.implementation.table
    )
    @rule(item=st.integers(0, 99), newest_first=st.booleans())
    def get_and_mutate_every_mapping(self, item: int, newest_first: bool) -> None:
        """Rule E on ``remove`` and rule S on ``get`` of every mapping while a
        snapshot is open: the oldest and the newest mappings are removed (a
        removed entry's shared chain predecessors are copied before one is
        relinked: new entries holding the snapshot's states), every other
        mapping is got and mutated (a get behind others in its chain copies
        them too), and the two are put back with their states; then every
        mapping is removed and put back in turn (an entry behind others in its
        chain relinks a shared predecessor). Oldest first or newest first: a
        chain holds its entries newest first, or oldest first after a rehash.
        Only the states' versions tell ``get`` to copy those states. Not while
        rehashing (a sweep of gets would finish the rehash at once), and not on
        tables (their maps are the map machines' to sweep)."""
        mapped = list(snapshot_contents(self.model))
        if not mapped:
            return
        if newest_first:
            mapped.reverse()
        # by position: HashKeys of one value and other hashes are equal, yet two mappings
        removed = {0, len(mapped) - 1}
        olds = [
            (mapped[i], self.equal_results("remove_and_get_old", *mapped[i])[0])
            for i in sorted(removed)
        ]
        for i, kn in enumerate(mapped):
            if i not in removed:
                self.get_and_mutate(kn, item)
        for kn, old in olds:
            self.put_checked(kn, old)
        for kn in mapped:  # rule E on remove everywhere: each chain position once
            self.put_checked(kn, self.equal_results("remove_and_get_old", *kn)[0])

    @precondition(
        lambda self: not self.implementation.table and not isinstance(self.impl, ReferenceStateMap)
    )
    @rule(kn=mappings, taken=st.integers(0, 2), remove=st.booleans())
    def iterate_across_a_change(self, kn: tuple[Any, Any], taken: int, remove: bool) -> None:
        """An iterator, then a ``remove`` (or a ``put``) of a mapped key: if the
        mapping went (or came), the iterator must fail fast. (Any copy-on-write
        map, broken C variants included; the reference model does not promise it,
        nor an implementation without the ``fail_fast`` capability.)"""
        capabilities = self.implementation.capabilities
        if not capabilities.fail_fast:
            return
        iterator = iter(self.impl)
        seen = list(itertools.islice(iterator, taken))
        size = len(self.impl)
        if remove:
            self.equal_results("remove", *kn)
        else:
            self.put_checked(kn, 0)
        if len(self.impl) == size or len(seen) < taken:
            return  # nothing added or removed (a replaced state may go on), or exhausted
        outcome = Outcome(lambda: list(iterator))
        assert isinstance(outcome.error, capabilities.concurrent_modification), (
            f"iteration across a {'remove' if remove else 'put'} of {kn!r} {outcome}, "
            f"expected {capabilities.concurrent_modification.__name__}"
        )

    def teardown(self) -> None:
        for impl, model, _ in self.open:
            impl.release()
            model.release()
        self.implementation.close(self.impl)


class StateTableMachine(StateMapMachine):
    """The map's rules on a state table, plus the rules of key groups."""

    #: A key group index, mapped onto the table's own key groups by the rules.
    key_group_choices = st.integers(0, 31)

    def key_group(self, choice: int) -> int:
        groups = sorted(self.model.key_groups)
        return int(groups[choice % len(groups)])

    def own_key_group(self, key: Any) -> int | None:
        """The key's key group by the model's plain assignment (None if it has none)."""
        try:
            key_group: int = self.model.key_group_of(key)
        except (ValueError, TypeError):
            return None
        return key_group

    @rule(target=StateMapMachine.mappings, kn=StateMapMachine.any_key, state=s.states)
    def put_in_key_group(self, kn: tuple[Any, Any], state: Any) -> tuple[Any, Any]:
        self.put_checked(kn, state, key_group=self.own_key_group(kn[0]))
        return kn

    @rule(kn=StateMapMachine.any_key, item=st.integers(0, 99))
    def get_in_key_group_and_mutate(self, kn: tuple[Any, Any], item: int) -> None:
        got = self.equal_results("get", *kn, key_group=self.own_key_group(kn[0]))
        self.caller_mutates(*got, item, got=True)

    @rule(kn=StateMapMachine.any_key, key_group=st.sampled_from([-1, 8, 4096]))
    def key_group_outside_the_table(self, kn: tuple[Any, Any], key_group: int) -> None:
        for side in (self.impl, self.model):
            outcome = Outcome(functools.partial(side.put, *kn, 1, key_group=key_group))
            assert outcome.error is not None, (
                f"put{kn!r} in key group {key_group} outside the table was accepted"
            )

    @rule(choice=key_group_choices)
    def entries_in_key_group(self, choice: int) -> None:
        key_group = self.key_group(choice)
        impl = snapshot_contents(self.impl.entries_in_key_group(key_group))
        model = snapshot_contents(self.model.entries_in_key_group(key_group))
        assert impl == model, f"key group {key_group}: implementation {impl!r}, model {model!r}"

    @precondition(lambda self: bool(self.open))
    @rule(index=st.integers(0, 7), choice=key_group_choices)
    def release_key_group(self, index: int, choice: int) -> None:
        impl, model, _ = self.open[index % len(self.open)]
        key_group = self.key_group(choice)
        self.compare_key_group(impl, model, key_group)
        impl.release_key_group(key_group)
        model.release_key_group(key_group)
        assert impl.is_key_group_released(key_group)
        assert impl.is_released == model.is_released

    @precondition(lambda self: bool(self.open))
    @rule(index=st.integers(0, 7))
    def release(self, index: int) -> None:
        impl, model, _ = self.pop_open(index)
        self.compare_snapshot(impl, model)
        impl.release()
        model.release()
        assert impl.is_released

    def user_code_target(self, kn: tuple[Any, Any]) -> dict[str, Any] | None:
        """A table routes a probe to the map of ``kn``'s own key group; a key the
        table refuses by the equal-keys rule (another type of its domain, NaN,
        -0.0) gets no probe: the key rule answers first (tests/test_equal_keys.py)."""
        key_group = self.own_key_group(kn[0])
        if key_group is None or key_group not in self.model.key_groups:
            return None
        try:
            self.model._owned(kn[0], key_group)
        except (TypeError, ValueError):
            return None
        return {"key_group": key_group}

    def compares_keys(self) -> bool:
        return isinstance(self.impl, StateTable)  # RocksDB compares bytes

    def copies_shared_states(self) -> bool:
        return isinstance(self.impl, CopyOnWriteStateTable)

    def map_of(self, key: Any, key_group: int | None = None) -> Any:
        key_group = self.own_key_group(key) if key_group is None else key_group
        if key_group is None or key_group not in self.model.key_groups:
            return None
        m = self.impl.state_map(key_group)
        return m if isinstance(m, MAP_CLASSES) else None

    def has_cow_maps(self) -> bool:
        """True where the table keeps its key groups in copy-on-write maps."""
        key_group = min(self.model.key_groups)
        return isinstance(self.impl.state_map(key_group), MAP_CLASSES)

    def read_rehash(self) -> tuple[bool, bool]:
        """(the copy-on-write map of some key group is rehashing, False)."""
        if not self.implementation.capabilities.snapshots:
            return (False, False)
        for key_group in self.model.key_groups:
            m = self.impl.state_map(key_group)
            if isinstance(m, MAP_CLASSES) and cov.is_rehashing(m):
                return (True, False)
        return (False, False)

    def record_snapshot(self) -> None:
        if self.rehashing():
            cov.record(cov.TABLE_SNAPSHOT_IN_REHASH)

    def compare_key_group(self, impl: Any, model: Any, key_group: int) -> None:
        if model.is_key_group_released(key_group):
            assert impl.is_key_group_released(key_group), (
                f"key group {key_group} of snapshot {impl.version} is open, the model's "
                "was released"
            )
            return
        contents = snapshot_contents(impl.key_group_entries(key_group))
        expected = model.key_group_contents(key_group)
        assert contents == expected, (
            f"snapshot {impl.version}, key group {key_group} changed: {contents!r} != "
            f"{dict(expected)!r}"
        )
        assert impl.size_of_key_group(key_group) == len(expected)

    def compare_snapshot(self, impl: Any, model: Any) -> None:
        for key_group in sorted(self.model.key_groups):
            self.compare_key_group(impl, model, key_group)

    @invariant()
    def open_snapshots_never_change(self) -> None:
        for impl, model, _ in self.open:
            self.compare_snapshot(impl, model)

    # ------------------------------------ rules that back the bad tables' catches

    #: Strings beyond the Basic Multilingual Plane: Java hashes their UTF-16 code
    #: units (two per character), so a hash over code points routes each of
    #: these to another key group of 8 (``string-hash-over-code-points``).
    astral_keys = st.sampled_from(
        ["\N{GRINNING FACE}", "\N{PARTY POPPER}", "\N{EARTH GLOBE EUROPE-AFRICA}"]
    )

    @rule(target=StateMapMachine.mappings, key=astral_keys, namespace=s.namespaces, state=s.states)
    def put_astral_key(self, key: str, namespace: Any, state: Any) -> tuple[Any, Any]:
        """``put`` of a key beyond the BMP, routed by the table itself."""
        self.put_checked((key, namespace), state)
        return (key, namespace)


class ChangeTracking(StateMapMachine):
    """The rules of change tracking (rules T and D of :mod:`cowstate.state_map`),
    mixed into the machine of a map whose capabilities say ``tracks_changes``
    (apart, like :class:`HostileUserCode`, so the other machines' examples stay
    as measured).

    ``take_base`` snapshots the map as a checkpoint would, records its
    version and the model's contents, and trims the removal log to it; the
    snapshot is released at once (the writer is done: from now on ``get``
    marks rather than copies) or stays open among the others, released by
    the ordinary rules. After
    every step, with the base ``b``:

    - every mapping the model holds that the base lacks or holds with another
      state is among the map's changed mappings (``state_version >= b``), and
      every key of the base the model lacks is among ``removals_since(b)`` --
      unless the map says it cannot tell (``removals_since`` None), which it
      may only when its log overflowed after the base (``tracking_since > b``);
    - (not with hostile user code, whose probes reach the map directly) both
      are among the keys a keyed operation named since the base: the tracking
      is a superset, not everything.
    """

    @rule(written=st.booleans())
    def take_base(self, written: bool) -> None:
        self.snapshot()
        version = self.open[-1][0].version
        self.base = (version, snapshot_contents(self.open[-1][1]))
        self.impl.trim_removals(version)
        self.touched = set()
        if written:
            self.release(len(self.open) - 1)

    @invariant()
    def changes_are_tracked(self) -> None:
        if self.base is None:
            return
        version, then = self.base
        now = snapshot_contents(self.model)
        changed = changed_keys(self.impl, version)
        removed = self.impl.removals_since(version)
        for kn, state in now.items():
            if kn not in then or then[kn] != state:
                assert kn in changed, (
                    f"{kn!r} changed since the base {version} ({then.get(kn)!r} -> {state!r}) "
                    f"but is not among the tracked changes {sorted(map(repr, changed))}"
                )
        if removed is None:
            assert self.impl.tracking_since > version, (
                f"removals since {version} unknown, yet tracking since {self.impl.tracking_since}"
            )
        else:
            for kn in then:
                if kn not in now:
                    assert kn in removed, (
                        f"{kn!r} was removed since the base {version} but is not among the "
                        f"tracked removals {removed!r}"
                    )
        if self.touched is not None and not isinstance(self, HostileUserCode):
            stray = [kn for kn in [*changed, *(removed or ())] if kn not in self.touched]
            assert not stray, f"{stray!r} tracked as changed since {version}, never named since"


class HostileUserCode(StateMapMachine):
    """The rule of hostile user code, mixed into a map or table machine by
    ``machine_for(..., hostile=True)``.

    It is not in the plain machines on purpose: adding any rule (even one
    that does nothing) changes every derandomized ``ci`` example, and the rare
    paths ``tests/test_coverage_events.py`` holds to thresholds were measured
    on the plain rule set. ``tests/test_user_code_errors.py`` runs the machine
    with this rule over every implementation; the ``hostile_*`` cases it
    dispatches to live in :class:`StateMapMachine`.
    """

    @rule(
        case=st.sampled_from(HOSTILE_CASES),
        kn=StateMapMachine.any_key,
        op=st.sampled_from(sorted(HOSTILE_CALLS)),
        as_key=st.booleans(),
        value=st.integers(0, 9),
    )
    def hostile_user_code(
        self, case: str, kn: tuple[Any, Any], op: str, as_key: bool, value: int
    ) -> None:
        """One rule for every case of hostile user code (one rule, not five, so
        the other rules' rare paths keep their share of the steps): ``case``
        names the method below; ``op`` is the keyed operation it calls (the
        copy cases use the operation that hands a state out instead:
        contains_key, put and remove stand for get, put_and_get_old and
        remove_and_get_old); ``as_key`` puts a probe in the key's place, else
        in the namespace's; ``value`` is the state the copy cases store."""
        kwargs = self.user_code_target(kn)
        if kwargs is None:
            return
        getattr(self, f"hostile_{case}")(kn, op, as_key, value, kwargs)


def _version(snapshot: Any) -> Any:
    """A snapshot's version for a message (``?`` where it has none)."""
    return getattr(snapshot, "version", "?")


def mappings_at_the_rehash_boundary(m: Any) -> list[tuple[Any, Any]]:
    """The mappings of the bucket the next rehash step of ``m`` stops at.

    A step moves whole buckets from the rehash index ``r`` on until at least
    ``MIN_TRANSFERRED_PER_INCREMENTAL_REHASH`` entries moved (invariant 9);
    the bucket after the last one it moves is the new ``r``, the first still
    in the old table. Empty if the step would finish the rehash or that
    bucket holds nothing.
    """
    view = view_of(m)
    primary, r = view._primary, view._rehash_index
    moved = 0
    while moved < MIN_TRANSFERRED_PER_INCREMENTAL_REHASH:
        if r == len(primary):
            return []
        e = primary[r]
        while e is not None:
            moved, e = moved + 1, e.next
        r += 1
    if r == len(primary):
        return []
    out = []
    e = primary[r]
    while e is not None:
        out.append((e.key, e.namespace))
        e = e.next
    return out


def machine_for(implementation: Implementation, *, hostile: bool = False) -> type[StateMapMachine]:
    """The state machine class that checks ``implementation`` (with the rule of
    hostile user code, :class:`HostileUserCode`, if ``hostile``)."""
    base: type[StateMapMachine] = StateTableMachine if implementation.table else StateMapMachine
    bases: tuple[type[StateMapMachine], ...] = (HostileUserCode, base) if hostile else (base,)
    if implementation.capabilities.tracks_changes:
        bases = (ChangeTracking, *bases)
    name = f"{'Hostile' if hostile else ''}{base.__name__}[{implementation.name}]"
    return type(name, bases, {"implementation": implementation})
