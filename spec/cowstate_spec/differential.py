"""The differential runner: one workload, an implementation against the model.

``run_workload`` applies an operation list (see
:mod:`cowstate_spec.workloads`) to an implementation and to the reference
model side by side and stops at the first divergence:

- a result that differs, or one side failing where the other does not;
- a size that differs (checked after every operation);
- a snapshot whose contents differ from the model's deep copy (each snapshot
  is compared in full at its release, and every open snapshot every
  ``check_every`` operations and at the end);
- a broken structural invariant (the implementation's checker, at the same
  cadence, and for a C map before each release: see "Structure first");
- an exception inside the implementation that is not a refusal from
  ``cowstate.errors`` (recorded with its traceback, never a crash of the run);
- an iteration that fails fast where the contract forbids it or goes on
  where it requires it to fail (``interrupt_iteration``, below);
- a leaked reference (maps with the ``frees_states`` capability): a list or
  dict state the map was given or mapped, that it maps no more and no open
  snapshot holds, still referenced (below, "Lifetimes").

``interrupt_iteration`` takes ``taken`` mappings from an iterator (each must
be one of the model's, once), applies a keyed operation to both sides and
then takes one more step. The step must raise ``ConcurrentModificationError``
when the model's key set changed (a mapping added or removed) or when the
map was rehashing before the operation (its rehash step relinks entries).
Otherwise the step must not raise for a map: the iteration goes on and
yields exactly the mappings it had not yet yielded, with their current
states (the mapping a ``put`` replaced: its new state or, where an open
snapshot shares its chain and the iterator walks the shared one, its old
state). A table iterates its key groups' maps one after the other, so a
rehash step in one of them may or may not reach the iterator: there,
without a key-set change, failing fast and going on are both allowed, and
going on must still yield exactly the rest. Implementations without the
``fail_fast`` capability (RocksDB) and the model itself only apply the
keyed operation.

**Lifetimes.** The runner watches the states a map holds
(:mod:`cowstate_spec.collected`, holding: the list and dict states it gives
the map, recorded with the step that gave them, and those it finds mapped
at a check). Where no snapshot is open at a ``check_every`` check, and at
the end of every workload after the final checks, once the runner has
released every snapshot still open, each recorded state the live map no
longer maps must have no reference left but the runner's own; the
divergence names it, the operation and step that gave it and the next one
that replaced or removed its mapping (``a leaked reference: state [5],
given to put at step 3 for (1, 'ns0') and replaced by put at step 7, is
still alive with 1 reference ...``). The states are plain lists and dicts,
so the map copies them as it copies any (a tracked subclass would take the
serializers' slow path); recording one per ``put`` and a few checks of one
iteration each cost about 5 % of the checked operations per CPU second
(``bench/bench_differential.py``). Tables are not watched (their maps are,
as maps), nor an implementation without ``frees_states``: a process
implementation (its objects are out of reach), which reports it as a
skipped check.

**Structure first.** Where the implementation has a structural checker,
the runner judges the structure before it reads the open snapshots at every
``check_every`` check, and, for an implementation whose memory is managed by
hand (``Implementation.memory_unsafe``: the C maps and the tables of them),
before each release's full comparison too. A C map that broke its version
bookkeeping (a release that forgot an older open snapshot: planted bug 5 of
:mod:`cowstate_spec.bad_cmaps`) frees at its next writes what an open
snapshot still reaches; a read through that snapshot then touches freed
memory and may crash the whole run, or loop on a chain through reused
memory, instead of reporting a divergence (one CI run in hundreds crashed
so, stop 37). Judged first, the bookkeeping is named at the release that
broke it, before a write can free anything. A pure-Python map cannot crash
the run that way, and its checker in Python would cost it half again its
time per run. The checks per release cost a C map's run 0-3 % and a table
of C maps' 10-18 % (``cowstate check --master in-process --workloads 8``
on the rehash-under-snapshots and long-lived-snapshots presets).

Each result also counts a few ``events``: the snapshots taken while a
copy-on-write map was rehashing (and how far it was: ``r > 0``,
``r >= 3L/4``, read from the map's structure; maps only, not tables), and
the interrupted iterations that failed fast or went on.

Where an implementation's capabilities differ (the RocksDB table), the run
follows them as the state machine does: ``put`` must return ``None``, a
mutated state reaches the model only where mutations persist, and
snapshot operations are skipped where there are no snapshots.

``minimize`` shrinks a diverging operation list by delta debugging to a
locally minimal one, and ``write_trace`` saves it as a replayable JSON trace
plus a ready pytest regression file.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import textwrap
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cowstate.errors import CowStateError
from cowstate_model import ReferenceStateMap, deep_copy
from cowstate_model.state_table import ReferenceStateTable
from cowstate_spec import contract as c
from cowstate_spec.cmap_view import MAP_CLASSES, rehash_progress, states_held_by_views
from cowstate_spec.collected import Lifetimes
from cowstate_spec.contract import TRANSFORMS, snapshot_contents
from cowstate_spec.implementations import Implementation
from cowstate_spec.protocol import ProtocolError
from cowstate_spec.workloads import Operation, decode, encode

__all__ = [
    "FAILED_FAST",
    "SNAPSHOT_IN_REHASH",
    "SNAPSHOT_IN_REHASH_LATE",
    "SNAPSHOT_IN_REHASH_STARTED",
    "WENT_ON",
    "WorkloadResult",
    "minimize",
    "run_workload",
    "write_trace",
]

#: The ``events`` a result counts (see the module doc).
SNAPSHOT_IN_REHASH = "snapshot in a rehash"
SNAPSHOT_IN_REHASH_STARTED = "snapshot in a rehash with r > 0"
SNAPSHOT_IN_REHASH_LATE = "snapshot in a rehash with r >= 3L/4"
FAILED_FAST = "interrupted iteration failed fast"
WENT_ON = "interrupted iteration went on"

_REFUSALS = (CowStateError, *ReferenceStateMap.Error)


@dataclass
class WorkloadResult:
    """What one workload did, and where it diverged (if it did)."""

    implementation: str
    workload: int
    seed: str
    operations: int
    applied: int = 0
    elapsed: float = 0.0
    #: CPU seconds of the running thread (wall time counts other processes too)
    cpu: float = 0.0
    operation_counts: dict[str, int] = field(default_factory=dict)
    #: rare paths the run met (the module doc), by name
    events: dict[str, int] = field(default_factory=dict)
    divergence_at: int | None = None
    divergence_operation: str | None = None  # JSON of the encoded operation
    expected: str | None = None
    actual: str | None = None

    @property
    def diverged(self) -> bool:
        return self.divergence_at is not None

    def as_record(self) -> dict[str, Any]:
        """The record ``cowstate check`` writes (operation counts stay a dict:
        a map column in Parquet)."""
        return asdict(self)


class Divergence(Exception):
    """The implementation and the model disagree."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


#: What a lifetime check expects (the module doc's "Lifetimes").
FREED = "every state the map maps no more freed once no open snapshot holds it"


class _Pair:
    """An implementation and the model, with their open snapshots; the
    lifetimes of the states the implementation holds (the module doc)."""

    def __init__(
        self,
        implementation: Implementation,
        ops: Sequence[Operation],
        initial_capacity: int | None,
    ) -> None:
        self.implementation = implementation
        self.ops = ops
        self.step = -1  # the position of the operation being applied (apply)
        self.impl = implementation.create(initial_capacity)
        self.model = implementation.model()
        self.open: list[tuple[Any, Any, Any]] = []
        self.events: Counter[str] = Counter()
        # Only the model may refuse with built-in exceptions; an implementation
        # refuses with cowstate.errors (or the refusals its capabilities name),
        # anything else is a crash.
        self.impl_refusals: tuple[type[BaseException], ...] = (
            _REFUSALS
            if isinstance(self.impl, ReferenceStateMap)
            else implementation.capabilities.refusals
        )
        self.concurrent_modification = implementation.capabilities.concurrent_modification
        self.methods = {
            name: (getattr(self.impl, name), getattr(self.model, name)) for name in _METHODS
        }
        self.lifetimes = (
            Lifetimes(lambda: states_held_by_views(self.impl), self.describe_origin, hold=True)
            if implementation.capabilities.frees_states and not implementation.table
            else None
        )

    def call(self, name: str, args: tuple[Any, ...]) -> tuple[Any, Any]:
        model_args = args
        if name in _STATE_TAKING:
            # Operations are data: each side gets its own copy of the state, so
            # in-place mutations never reach the operation list (or the other side).
            model_args = (args[0], args[1], deep_copy(args[2]))
            state = (
                deep_copy(args[2])
                if self.lifetimes is None
                else self.lifetimes.track(args[2], self.step)  # the module doc's "Lifetimes"
            )
            args = (args[0], args[1], state)
        impl_method, model_method = self.methods[name]
        impl_value = model_value = impl_error = model_error = None
        try:
            model_value = model_method(*model_args)
        except _REFUSALS as exc:
            model_error = exc
        try:
            impl_value = impl_method(*args)
        except self.impl_refusals as exc:
            impl_error = exc
        if (model_error is None) != (impl_error is None):
            raise Divergence(
                "a refusal" if model_error else repr(model_value),
                repr(impl_error) if impl_error else repr(impl_value),
            )
        # A refusal's traceback holds this frame, which holds the refusal: a
        # cycle that would keep the states of every frame alive until the
        # next collection (and make a lifetime check collect).
        impl_error = model_error = None
        return impl_value, model_value

    def same(self, name: str, args: tuple[Any, ...]) -> tuple[Any, Any]:
        impl, model = self.call(name, args)
        if impl != model:
            raise Divergence(repr(model), repr(impl))
        return impl, model

    def apply(self, op: Operation, step: int) -> None:
        """Apply ``op``, the operation at position ``step`` of the workload."""
        self.step = step
        name = op[0]
        capabilities = self.implementation.capabilities
        if name == "put" and not capabilities.put_reports_insert:
            impl, _ = self.call(name, op[1:])
            if impl is not None:
                raise Divergence("None", repr(impl))
        elif name in _SIMPLE:
            self.same(name, op[1:])
        elif name in _HANDS_OUT:
            # The caller owns what these return and mutates it in place.
            if name == "get_and_mutate":
                impl, model = self.same("get", op[1:3])
                item = op[3]
            else:
                impl, model = self.same(name, op[1:])
                item = 7
            if c.mutate_in_place(impl, item) and capabilities.mutations_persist:
                c.mutate_in_place(model, item)
        elif name == "transform":
            self.call(name, (op[1], op[2], op[3], TRANSFORMS[op[4]]))
        elif name in ("snapshot", "release") and not capabilities.snapshots:
            pass
        elif name == "snapshot":
            self.count_snapshot()
            impl = self.impl.snapshot()
            # Identities only: the model comparison at release checks the values.
            fp = (
                self.implementation.fingerprint(impl, values=False)
                if self.implementation.fingerprint
                else None
            )
            self.open.append((impl, self.model.snapshot(), fp))
        elif name == "release":
            if self.open:
                if self.implementation.memory_unsafe:
                    self.check_structure()  # before the read below ("Structure first")
                impl, model, _ = self.open.pop(op[1] % len(self.open))
                self.compare_snapshot(impl, model)  # in full, at its release
                impl.release()
                model.release()
        elif name == "iterate":
            impl_all, model_all = snapshot_contents(self.impl), snapshot_contents(self.model)
            if impl_all != model_all:
                raise Divergence(repr(model_all), repr(impl_all))
        elif name == "interrupt_iteration":
            self.interrupt_iteration(*op[1:])
        elif name == "keys":
            impl_keys = Counter(self.impl.keys(op[1]))
            model_keys = Counter(self.model.keys(op[1]))
            if impl_keys != model_keys:
                raise Divergence(repr(model_keys), repr(impl_keys))
        else:
            raise ValueError(f"expected a workload operation, got {name!r}")
        if len(self.impl) != len(self.model):
            raise Divergence(f"size {len(self.model)}", f"size {len(self.impl)}")

    def interrupt_iteration(
        self, taken: int, keyed: str, key: Any, namespace: Any, state: Any
    ) -> None:
        """Iterate part way, apply ``keyed``, take one more step (the module doc)."""
        operation = (keyed, key, namespace, state) if keyed == "put" else (keyed, key, namespace)
        if not self.implementation.capabilities.fail_fast or isinstance(
            self.impl, ReferenceStateMap | ReferenceStateTable
        ):
            self.apply(operation, self.step)
            return
        before = snapshot_contents(self.model)
        kn = (key, namespace)
        adds_or_removes = (keyed == "put") != (kn in before) and keyed != "get"
        # Whether a rehash runs matters only where no mapping comes or goes (a
        # C map's structure costs an export to read).
        rehashing = None if adds_or_removes else self.rehashing()
        iterator = iter(self.impl)
        seen = snapshot_contents(itertools.islice(iterator, taken % (len(before) + 1)))
        if any(before.get(kn, _ABSENT) != st for kn, st in seen.items()):
            raise Divergence(f"mappings of {dict(before)!r}", f"iteration yielded {seen!r}")
        size = len(self.model)
        self.apply(operation, self.step)
        must_fail = len(self.model) != size or rehashing is True
        try:
            step = [next(iterator)]
        except StopIteration:
            step = []
        except self.concurrent_modification:
            if not must_fail and rehashing is False:
                raise Divergence(
                    f"the iteration going on after {keyed}, which changed no mapping "
                    "outside a rehash",
                    self.concurrent_modification.__name__,
                ) from None
            self.events[FAILED_FAST] += 1
            return
        if must_fail:
            why = "a mapping was added or removed" if len(self.model) != size else "a rehash step"
            raise Divergence(
                f"{self.concurrent_modification.__name__} at the step after {keyed} ({why})",
                f"the iteration went on with {step!r}",
            )
        rest = snapshot_contents(itertools.chain(step, iterator))
        now = snapshot_contents(self.model)
        expected = {kn: st for kn, st in now.items() if kn not in seen}
        if kn in rest and rest[kn] == before.get(kn, _ABSENT):
            # The iterator may hold the chain a snapshot shares (rule E copied
            # the entry): the replaced state or the new one, both are right.
            expected[kn] = rest[kn]
        if rest != expected or seen.keys() - now.keys():
            raise Divergence(f"the rest of the iteration {expected!r}", repr(rest))
        self.events[WENT_ON] += 1

    def rehashing(self) -> bool | None:
        """Whether the implementation (a copy-on-write map) is rehashing; None
        where that is not known (a table, another map)."""
        if not isinstance(self.impl, MAP_CLASSES):
            return None
        return rehash_progress(self.impl) is not None

    def count_snapshot(self) -> None:
        """Count a snapshot taken in a rehash, and how far the rehash got."""
        if not isinstance(self.impl, MAP_CLASSES):
            return
        progress = rehash_progress(self.impl)
        if progress is None:
            return
        self.events[SNAPSHOT_IN_REHASH] += 1
        r, capacity = progress
        if r > 0:
            self.events[SNAPSHOT_IN_REHASH_STARTED] += 1
        if 4 * r >= 3 * capacity:
            self.events[SNAPSHOT_IN_REHASH_LATE] += 1

    def compare_snapshot(self, impl: Any, model: Any) -> None:
        got = snapshot_contents(impl)
        if got != model.contents:
            raise Divergence(f"snapshot {model.version} = {dict(model.contents)!r}", repr(got))

    def compare_snapshots(self) -> None:
        """Every open snapshot against the model's copy."""
        for impl, model, _ in self.open:
            self.compare_snapshot(impl, model)

    def check_structure(self) -> None:
        """The implementation's structural invariants (its checker, if it has
        one), judged before any snapshot is read ("Structure first", above)."""
        if self.implementation.check is not None:
            try:
                self.implementation.check(self.impl, [fp for *_, fp in self.open if fp])
            except AssertionError as exc:
                raise Divergence("all structural invariants", str(exc)) from exc

    def check_all(self) -> None:
        self.check_structure()
        self.compare_snapshots()
        if not self.open:
            self.check_lifetimes()

    def finish(self) -> None:
        """The end of the workload, after its final checks: release every
        snapshot still open, then check the lifetimes (``check_all`` just did
        where none was)."""
        if not self.open:
            return
        for impl, model, _ in self.open:
            impl.release()
            model.release()
        # (a fingerprint holds states: none may outlive this line, not even in a local)
        del impl, model, _
        self.open.clear()
        self.check_lifetimes()

    def check_lifetimes(self) -> None:
        """No state the map maps no more may be alive (no snapshot is open)."""
        if self.lifetimes is None:
            return
        try:
            self.lifetimes.check((state for _, _, state in self.impl), False, (self.step,))
        except AssertionError as exc:
            raise Divergence(FREED, str(exc)) from None

    def describe_origin(self, origin: int | tuple[int]) -> str:
        """Where a recorded state came from, in words: ``step`` (an int) for the
        state given at that step, ``(step,)`` for one first seen mapped at the
        check after that step; and the first operation after it that replaced
        or removed its mapping."""
        if isinstance(origin, tuple):
            return f"first seen mapped at the check after step {origin[0]}"
        name, key, namespace = _keyed_operation(self.ops[origin])[:3]
        words = f"given to {name} at step {origin} for ({key!r}, {namespace!r})"
        for step in range(origin + 1, self.step + 1):
            later = _keyed_operation(self.ops[step])
            if later[0] not in _WRITES or (later[0] == "transform" and later[4] not in _STORES):
                continue
            if later[1] == key and later[2] == namespace and hash(later[1]) == hash(key):
                how = "removed" if later[0] in ("remove", "remove_and_get_old") else "replaced"
                return f"{words} and {how} by {later[0]} at step {step}"
        return words

    def close(self) -> None:
        for impl, model, _ in self.open:
            if not getattr(impl, "is_released", False):
                impl.release()
            model.release()
        self.implementation.close(self.impl)


_ABSENT = object()


_SIMPLE = frozenset({"get", "contains_key", "remove", "put"})
#: The operations that may replace or remove a mapping (a transform only with
#: a function of _STORES: the others keep the state or change nothing).
_WRITES = frozenset({"put", "put_and_get_old", "remove", "remove_and_get_old", "transform"})
_STORES = frozenset({"replace_with_value"})
_HANDS_OUT = frozenset({"get_and_mutate", "remove_and_get_old", "put_and_get_old"})
_STATE_TAKING = frozenset({"put", "put_and_get_old"})
_METHODS = (
    "get",
    "contains_key",
    "remove",
    "put",
    "remove_and_get_old",
    "put_and_get_old",
    "transform",
)


def _keyed_operation(op: Operation) -> Operation:
    """``op``, or the keyed operation an ``interrupt_iteration`` applies."""
    if op[0] == "interrupt_iteration":
        _, _, keyed, key, namespace, state = op
        return (keyed, key, namespace, state)
    return op


def run_workload(
    implementation: Implementation,
    ops: Sequence[Operation],
    *,
    workload: int = 0,
    seed: str = "",
    check_every: int = 200,
    initial_capacity: int | None = None,
) -> WorkloadResult:
    """Apply ``ops`` to ``implementation`` and the model; stop at the first divergence."""
    result = WorkloadResult(implementation.name, workload, seed, len(ops))
    counts: Counter[str] = Counter()
    started, started_cpu = time.perf_counter(), time.thread_time()
    # A process implementation (cowstate_spec.process_impl) brings its own pair,
    # which sends the operations to its child in batches.
    make_pair = getattr(implementation, "pair", None)
    pair: Any = (
        make_pair(ops, initial_capacity, check_every)
        if make_pair is not None
        else _Pair(implementation, ops, initial_capacity)
    )
    position = 0
    try:
        for position, op in enumerate(ops):
            pair.apply(op, position)
            counts[op[0]] += 1
            if check_every and (position + 1) % check_every == 0:
                pair.check_all()
        position = len(ops)
        pair.check_all()
        pair.finish()
    except Divergence as exc:
        result.expected, result.actual = exc.expected, exc.actual
        result.divergence_at = position
    except ProtocolError:
        raise  # the implementation's process cannot be checked: an error of the run
    except Exception:
        result.expected, result.actual = "no exception", traceback.format_exc()
        result.divergence_at = position
    finally:
        pair.close()
    result.events = dict(pair.events)
    if result.divergence_at is not None:
        at = result.divergence_at
        result.divergence_operation = json.dumps(encode(ops[at]) if at < len(ops) else ["end"])
    result.applied = sum(counts.values())
    result.operation_counts = dict(counts)
    result.elapsed = time.perf_counter() - started
    result.cpu = time.thread_time() - started_cpu + getattr(pair, "child_cpu", 0.0)
    return result


def minimize(
    implementation: Implementation,
    ops: Sequence[Operation],
    *,
    initial_capacity: int | None = None,
    max_runs: int = 20_000,
) -> list[Operation]:
    """A locally minimal diverging sub-list of ``ops`` (delta debugging).

    Every candidate is re-checked with the strictest cadence (snapshots and
    structure after every operation). The result diverges, and removing any
    single operation from it makes it pass.
    """
    runs = 0

    def diverges(candidate: Sequence[Operation]) -> bool:
        nonlocal runs
        runs += 1
        return run_workload(
            implementation, candidate, check_every=1, initial_capacity=initial_capacity
        ).diverged

    first = run_workload(implementation, ops, check_every=1, initial_capacity=initial_capacity)
    if not first.diverged:
        raise ValueError(
            f"expected a diverging workload for {implementation.name}, "
            "got one that agrees with the model"
        )
    assert first.divergence_at is not None
    current = list(ops[: first.divergence_at + 1])
    granularity = 2
    while len(current) >= 2 and runs < max_runs:
        chunk = -(-len(current) // granularity)
        for start in range(0, len(current), chunk):
            candidate = current[:start] + current[start + chunk :]
            if candidate and diverges(candidate):
                current = candidate
                granularity = max(granularity - 1, 2)
                break
        else:
            if granularity >= len(current):
                break
            granularity = min(granularity * 2, len(current))
    changed = True
    while changed and runs < max_runs:  # one-by-one: 1-minimal
        changed = False
        for i in range(len(current)):
            candidate = current[:i] + current[i + 1 :]
            if candidate and diverges(candidate):
                current = candidate
                changed = True
                break
    return current


def write_trace(
    out_dir: Path,
    tests_dir: Path | None,
    implementation: Implementation,
    ops: Sequence[Operation],
    result: WorkloadResult,
    initial_capacity: int | None = None,
) -> tuple[Path, Path | None]:
    """Save ``ops`` as a JSON trace in ``out_dir`` and, if ``tests_dir`` is given,
    a pytest regression file there; return both paths."""
    slug = re.sub(r"[^a-z0-9]+", "_", f"{implementation.name}_{result.seed}".lower()).strip("_")
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = {
        "implementation": implementation.name,
        "workload": result.workload,
        "seed": result.seed,
        "initial_capacity": initial_capacity,
        "expected": result.expected,
        "actual": result.actual,
        "operations": [encode(op) for op in ops],
    }
    trace_path = out_dir / f"trace_{slug}.json"
    trace_path.write_text(json.dumps(trace, indent=1) + "\n")
    if tests_dir is None:
        return trace_path, None
    tests_dir.mkdir(parents=True, exist_ok=True)
    test_path = tests_dir / f"test_{slug}.py"
    found = textwrap.fill(
        f"Found by cowstate check: expected {_one_line(result.expected)}, "
        f"got {_one_line(result.actual)}.",
        width=88,
        break_long_words=True,
    )
    # One operation per line, as Python literals: an operation of any length
    # stays one line (fmt: off; noqa E501 past the project's 100 columns), so
    # the file passes the project's ruff check and ruff format --check.
    lines = "\n".join(_long_ok(f"    {_literal(encode(op))},") for op in ops)
    test_path.write_text(f'''"""Regression: minimized divergence of {implementation.name}.

Seed {result.seed}, workload {result.workload}.

{found}
"""

from cowstate_spec.differential import run_workload
from cowstate_spec.implementations import by_name
from cowstate_spec.workloads import decode

# fmt: off
OPERATIONS = [
{lines}
]
# fmt: on


def test_{slug}_agrees_with_the_model() -> None:
    result = run_workload(
        by_name({_literal(implementation.name)}),
        [decode(op) for op in OPERATIONS],
        check_every=1,
        initial_capacity={initial_capacity!r},
    )
    assert not result.diverged, (result.divergence_at, result.expected, result.actual)
''')
    return trace_path, test_path


def _long_ok(line: str) -> str:
    return f"{line}  # noqa: E501" if len(line) > 100 else line


def _literal(value: Any) -> str:
    """``value`` (an encoded operation: JSON's types) as a Python literal that
    evaluates to it, strings in double quotes with every character outside
    printable ASCII escaped (lone surrogates too, which no UTF-8 file holds)."""
    if value is None or isinstance(value, bool | int):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value!r}")'
    if isinstance(value, str):
        return '"' + "".join(_escaped(ch) for ch in value) + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"expected an encoded operation's value, got {type(value).__name__}")


def _escaped(ch: str) -> str:
    if ch in '"\\':
        return "\\" + ch
    code = ord(ch)
    if 0x20 <= code < 0x7F:
        return ch
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def load_trace(path: Path) -> tuple[str, list[Operation], int | None]:
    """The implementation name, operations and capacity of a JSON trace."""
    trace = json.loads(path.read_text())
    return (
        trace["implementation"],
        [decode(op) for op in trace["operations"]],
        trace.get("initial_capacity"),
    )


def _one_line(text: str | None) -> str:
    line = (text or "").strip().splitlines()[-1:] or [""]
    return line[0].replace('"""', "'''")[:200]
