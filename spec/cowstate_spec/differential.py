"""Differential runs: random workloads, an implementation against the model.

``generate(seed, ops)`` turns a seed into a deterministic operation list
(``random.Random`` only: the same seed gives the same operations on any
machine and any ``PYTHONHASHSEED``). ``run_workload`` applies it to an
implementation and to the model side by side and stops at the first
divergence: a different result or size, an open snapshot whose contents
differ from the model's, a broken structural invariant, or an exception
inside the implementation (reported with its traceback, never a crash).
"""

from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cowstate.errors import CowStateError
from cowstate_model import ReferenceStateMap
from cowstate_spec import strategies as s
from cowstate_spec.implementations import Implementation
from cowstate_spec.invariants import SnapshotFingerprint
from cowstate_spec.keys import HashKey
from cowstate_spec.machine import snapshot_contents

Operation = tuple[Any, ...]

TRANSFORMS = {f.__name__: f for f in (s.add_or_append, s.replace_with_value, s.raise_error,
                                      s.return_none)}

#: Relative weight of each operation in a generated workload.
DEFAULT_MIX: dict[str, int] = {
    "put": 30, "get": 15, "get_and_mutate": 15, "contains_key": 5, "put_and_get_old": 5,
    "remove": 8, "remove_and_get_old": 4, "transform": 6, "snapshot": 2, "release": 2,
    "iterate": 1, "keys": 1,
}


@dataclass
class WorkloadResult:
    """What one workload did, and where it diverged (if it did)."""

    implementation: str
    seed: int
    operations: int
    applied: int = 0
    elapsed: float = 0.0
    operation_counts: Counter[str] = field(default_factory=Counter)
    divergence_at: int | None = None
    divergence_operation: Operation | None = None
    expected: str | None = None
    actual: str | None = None

    @property
    def diverged(self) -> bool:
        return self.divergence_at is not None


def generate(seed: int, operations: int, key_space: int = 48, namespaces: int = 3,
             collision_share: float = 0.15, mutable_share: float = 0.6,
             mix: dict[str, int] | None = None) -> list[Operation]:
    """A deterministic operation list for ``seed``."""
    rng = random.Random(seed)
    mix = mix or DEFAULT_MIX
    names, weights = list(mix), list(mix.values())

    def key() -> Any:
        k = rng.randrange(key_space)
        if rng.random() < collision_share:
            return HashKey(k, k % 4)          # same hash for many keys: long chains
        return k if k % 3 else f"k{k}"

    def state() -> Any:
        if rng.random() < mutable_share:
            return [rng.randrange(100)] if rng.random() < 0.7 else {"v": rng.randrange(100)}
        return rng.randrange(1000)

    ops: list[Operation] = []
    for _ in range(operations):
        name = rng.choices(names, weights)[0]
        ns = f"ns{rng.randrange(namespaces)}"
        if name in ("put", "put_and_get_old"):
            ops.append((name, key(), ns, state()))
        elif name in ("get", "contains_key", "remove", "remove_and_get_old"):
            ops.append((name, key(), ns))
        elif name == "get_and_mutate":
            ops.append((name, key(), ns, rng.randrange(100)))
        elif name == "transform":
            ops.append((name, key(), ns, rng.randrange(10), rng.choice(sorted(TRANSFORMS))))
        elif name == "release":
            ops.append((name, rng.randrange(8)))
        elif name == "keys":
            ops.append((name, ns))
        else:
            ops.append((name,))
    return ops


class _Divergence(Exception):
    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class _Pair:
    """An implementation and the model, with their open snapshots."""

    def __init__(self, implementation: Implementation) -> None:
        self.implementation = implementation
        self.impl = implementation.factory()
        self.model = ReferenceStateMap()
        self.open: list[tuple[Any, Any, SnapshotFingerprint | None]] = []

    def call(self, name: str, *args: Any) -> tuple[Any, Any]:
        model_error = impl_error = None
        model_value = impl_value = None
        try:
            model_value = getattr(self.model, name)(*_copy(args))
        except Exception as exc:
            model_error = exc
        try:
            impl_value = getattr(self.impl, name)(*args)
        except Exception as exc:
            if not isinstance(exc, (CowStateError, *ReferenceStateMap.Error)):
                raise          # not a refusal: a crash inside the implementation
            impl_error = exc
        if (model_error is None) != (impl_error is None):
            raise _Divergence(f"{'an error' if model_error else repr(model_value)}",
                              f"{impl_error!r}" if impl_error else repr(impl_value))
        return impl_value, model_value

    def same(self, name: str, *args: Any) -> tuple[Any, Any]:
        impl, model = self.call(name, *args)
        if impl != model:
            raise _Divergence(repr(model), repr(impl))
        return impl, model

    def apply(self, op: Operation) -> None:
        name, args = op[0], op[1:]
        if name in ("get", "contains_key", "remove", "put"):
            self.same(name, *args)
        elif name in ("get_and_mutate", "remove_and_get_old", "put_and_get_old"):
            # The caller owns what these return and mutates it in place.
            real, item = ("get", args[2]) if name == "get_and_mutate" else (name, 7)
            impl, model = self.same(real, *(args[:2] if real == "get" else args))
            if s.mutate_in_place(impl, item):
                s.mutate_in_place(model, item)
        elif name == "transform":
            self.call(name, *args[:3], TRANSFORMS[args[3]])
        elif name == "snapshot":
            impl = self.impl.snapshot()
            fp = (self.implementation.fingerprint(impl)
                  if self.implementation.fingerprint else None)
            self.open.append((impl, self.model.snapshot(), fp))
            self.compare_snapshots()
        elif name == "release":
            if self.open:
                self.compare_snapshots()
                impl, model, _ = self.open.pop(args[0] % len(self.open))
                impl.release()
                model.release()
        elif name == "iterate":
            if snapshot_contents(self.impl) != snapshot_contents(self.model):
                raise _Divergence(repr(snapshot_contents(self.model)),
                                  repr(snapshot_contents(self.impl)))
        elif name == "keys":
            impl_keys, model_keys = Counter(self.impl.keys(args[0])), Counter(
                self.model.keys(args[0]))
            if impl_keys != model_keys:
                raise _Divergence(repr(model_keys), repr(impl_keys))
        else:
            raise ValueError(f"expected an operation of {sorted(DEFAULT_MIX)}, got {name!r}")
        if len(self.impl) != len(self.model):
            raise _Divergence(f"size {len(self.model)}", f"size {len(self.impl)}")

    def compare_snapshots(self) -> None:
        for impl, model, _ in self.open:
            got = snapshot_contents(impl)
            if got != model.contents:
                raise _Divergence(f"snapshot {model.version} = {dict(model.contents)!r}",
                                  repr(got))

    def check_structure(self) -> None:
        if self.implementation.check is not None:
            try:
                self.implementation.check(self.impl, [fp for *_, fp in self.open if fp])
            except AssertionError as exc:
                raise _Divergence("all structural invariants", str(exc)) from exc

    def close(self) -> None:
        for impl, model, _ in self.open:
            if not impl.is_released:
                impl.release()
            model.release()


def _copy(args: tuple[Any, ...]) -> tuple[Any, ...]:
    import copy

    return copy.deepcopy(args)


def run_workload(implementation: Implementation, ops: list[Operation], seed: int = 0,
                 check_every: int = 50) -> WorkloadResult:
    """Apply ``ops`` to ``implementation`` and the model; stop at the first divergence."""
    result = WorkloadResult(implementation.name, seed, len(ops))
    started = time.perf_counter()
    pair = _Pair(implementation)
    try:
        for position, op in enumerate(ops):
            try:
                pair.apply(op)
                if check_every and (position + 1) % check_every == 0:
                    pair.compare_snapshots()
                    pair.check_structure()
            except _Divergence as exc:
                result.divergence_at, result.divergence_operation = position, op
                result.expected, result.actual = exc.expected, exc.actual
                break
            except Exception:
                result.divergence_at, result.divergence_operation = position, op
                result.expected = "no exception"
                result.actual = traceback.format_exc()
                break
            result.applied += 1
            result.operation_counts[op[0]] += 1
        else:
            try:
                pair.compare_snapshots()
                pair.check_structure()
            except _Divergence as exc:
                result.divergence_at, result.divergence_operation = len(ops), ("end",)
                result.expected, result.actual = exc.expected, exc.actual
    finally:
        pair.close()
    result.elapsed = time.perf_counter() - started
    return result
