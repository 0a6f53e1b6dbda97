"""Workload specs and the deterministic operation generator.

A :class:`WorkloadSpec` (pydantic; loads from and saves to JSON or YAML)
says how many workloads to run, how long each is, and what they look like:
the operation mix, the key domain and its distribution, namespaces, state
kinds, colliding keys, the initial capacity, how many snapshots may be open,
in which order they are released and where they are taken, and which
implementations to check.

Two operations aim at what a random mix rarely shows:

- ``interrupt_iteration`` iterates the map part way, applies a keyed
  operation (``put``, ``remove`` or ``get``), then takes the iterator's next
  step: it must raise ``ConcurrentModificationError`` exactly when the
  contract says (a mapping was added or removed, or the operation's rehash
  step relinked entries), and otherwise go on with every remaining mapping.
- ``snapshot_placement="in-rehash"`` takes snapshots only while the map
  rehashes. The generator knows no hashes, only sizes: it follows the live
  key set, starts a rehash where the map doubles (an insertion into a map
  above three quarters of its capacity) and ends it after about one keyed
  operation per four entries (each step moves at least four); while one
  runs, after its first step, every other operation is a snapshot (a release
  when ``max_open_snapshots`` are open). The run counts the snapshots that
  really met a rehash (:mod:`cowstate_spec.differential`).

``operations(spec, index)`` turns a spec and a workload index into an
operation list. It uses only ``random.Random`` seeded by a string (hashed
with SHA-512 by the random module), never ``hash()``: the same index gives
the same operations on any machine under any ``PYTHONHASHSEED``. Executors
receive indices, never operations.

An operation is a tuple ``(name, *args)``; :func:`encode` and
:func:`decode` turn one into JSON-ready lists and back (``HashKey`` keys
become ``{"HashKey": [value, hash]}``).
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cowstate.arithmetic import clamp_capacity, threshold_for
from cowstate.errors import InvalidArgumentError
from cowstate_spec.keys import HashKey

__all__ = [
    "OPERATIONS",
    "PRESETS",
    "Operation",
    "SpecFileError",
    "WorkloadSpec",
    "decode",
    "encode",
    "operations",
    "preset",
]

Operation = tuple[Any, ...]

#: Every operation a workload can contain.
OPERATIONS = (
    "put",
    "get",
    "get_and_mutate",
    "contains_key",
    "put_and_get_old",
    "remove",
    "remove_and_get_old",
    "transform",
    "snapshot",
    "release",
    "iterate",
    "keys",
    "interrupt_iteration",
)
#: The keyed operations ``interrupt_iteration`` applies in the middle of an iteration.
INTERRUPTIONS = ("put", "remove", "get")
TransformFunction = Literal["add_or_append", "replace_with_value", "raise_error", "return_none"]
TRANSFORM_FUNCTIONS: tuple[TransformFunction, ...] = (
    "add_or_append",
    "replace_with_value",
    "raise_error",
    "return_none",
)

StateKind = Literal["int", "str", "list", "dict"]
DEFAULT_STATE_KINDS: tuple[StateKind, ...] = ("int", "list", "dict")

DEFAULT_MIX: dict[str, float] = {
    "put": 30,
    "get": 15,
    "get_and_mutate": 15,
    "contains_key": 5,
    "put_and_get_old": 5,
    "remove": 8,
    "remove_and_get_old": 4,
    "transform": 6,
    "snapshot": 2,
    "release": 2,
    "iterate": 0.2,
    "keys": 0.5,
    "interrupt_iteration": 0.5,
}


class WorkloadSpec(BaseModel):
    """What a differential run does. Unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    workloads: int = Field(100, ge=1, description="number of workloads")
    operations_per_workload: int = Field(2000, ge=1)
    base_seed: int = Field(0, ge=0)
    mix: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_MIX))
    key_domain: int = Field(64, ge=1, le=10_000_000, description="distinct keys")
    key_distribution: Literal["uniform", "zipf", "hot-set"] = "uniform"
    zipf_exponent: float = Field(1.1, gt=0, le=10)
    hot_set_size: int = Field(8, ge=1)
    hot_set_share: float = Field(0.8, ge=0, le=1)
    namespaces: int = Field(3, ge=1, le=1000)
    state_kinds: list[StateKind] = Field(
        default_factory=lambda: list(DEFAULT_STATE_KINDS), min_length=1
    )
    collision_share: float = Field(
        0.1, ge=0, le=1, description="share of keys that are HashKeys with colliding hashes"
    )
    initial_capacity: int = Field(4, ge=0, le=1 << 30)
    max_open_snapshots: int = Field(3, ge=1, le=64)
    release_order: Literal["fifo", "lifo", "random"] = "random"
    snapshot_placement: Literal["anywhere", "in-rehash"] = Field(
        "anywhere",
        description="'in-rehash': snapshots only while the map rehashes (see the module doc)",
    )
    check_every: int = Field(
        200,
        ge=0,
        description="compare open snapshots and check structure every N operations (0: never)",
    )
    implementations: list[str] = Field(
        default_factory=lambda: _default_implementations(), min_length=1
    )
    transform_functions: list[TransformFunction] = Field(
        default_factory=lambda: list(TRANSFORM_FUNCTIONS),
        min_length=1,
        description="the functions transforms apply (leaving out the failing ones checks "
        "an implementation past a known difference)",
    )

    @field_validator("mix")
    @classmethod
    def _mix_has_weight(cls, mix: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(mix) - set(OPERATIONS))
        if unknown:
            raise ValueError(f"expected operations among {list(OPERATIONS)}, got {unknown}")
        negative = {k: v for k, v in mix.items() if v < 0}
        if negative:
            raise ValueError(f"expected weights >= 0, got {negative}")
        if not any(v > 0 for k, v in mix.items() if k not in ("snapshot", "release")):
            raise ValueError("expected a positive weight for at least one map operation")
        return mix

    @field_validator("implementations")
    @classmethod
    def _known_implementations(cls, names: list[str]) -> list[str]:
        from cowstate_spec.implementations import by_name

        for name in names:
            try:
                by_name(name)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
        return names

    @model_validator(mode="after")
    def _hot_set_fits(self) -> WorkloadSpec:
        if self.key_distribution == "hot-set" and self.hot_set_size > self.key_domain:
            raise ValueError(
                f"expected hot_set_size <= key_domain ({self.key_domain}), got {self.hot_set_size}"
            )
        return self

    @property
    def total_operations(self) -> int:
        return self.workloads * self.operations_per_workload

    @classmethod
    def load(cls, path: str | Path) -> WorkloadSpec:
        """Read a spec from a ``.json``, ``.yaml`` or ``.yml`` file.

        Raises :class:`SpecFileError` when the file cannot be read or parsed
        and pydantic's ``ValidationError`` when a field is wrong.
        """
        path = Path(path)
        if path.suffix not in (".json", ".yaml", ".yml"):
            raise SpecFileError(path, f"expected a .json, .yaml or .yml file, got {path.name!r}")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecFileError(path, "does not exist; expected a workload spec file") from None
        except IsADirectoryError:
            raise SpecFileError(path, "is a directory, expected a workload spec file") from None
        except UnicodeDecodeError as exc:
            raise SpecFileError(
                path, f"is not UTF-8 text (byte {exc.start}); expected JSON or YAML"
            ) from None
        except OSError as exc:
            raise SpecFileError(path, f"cannot be read ({exc.strerror or exc})") from None
        data = _parse(path, text)
        if data is None:
            raise SpecFileError(path, "is empty, expected a mapping of spec fields")
        return cls.model_validate(data)

    def save(self, path: str | Path) -> None:
        """Write the spec as JSON or YAML, by the file's suffix."""
        path = Path(path)
        data = self.model_dump(mode="json")
        if path.suffix in (".yaml", ".yml"):
            path.write_text(yaml.safe_dump(data, sort_keys=False))
        else:
            path.write_text(json.dumps(data, indent=2) + "\n")


class SpecFileError(InvalidArgumentError):
    """A spec file that cannot be read or parsed (its fields are pydantic's to judge)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"spec file {str(path)!r} {problem}")
        self.path = path
        self.problem = problem


def _parse(path: Path, text: str) -> Any:
    """The data of a spec file's text, by its suffix."""
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecFileError(
                path, f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecFileError(path, f"is not valid YAML ({where}{problem})") from None


def _default_implementations() -> list[str]:
    """Both maps: the pure one, and the C one where it is built and checkable
    (its probe built with it)."""
    from cowstate_spec.cmap_view import C_MAP_CLASS

    return ["cow-map"] if C_MAP_CLASS is None else ["cow-map", "c-map"]


def _table_implementations() -> list[str]:
    """Every state table over all its key groups: copy-on-write over each map,
    nested dicts, RocksDB."""
    from cowstate_spec.implementations import TABLE_TYPES

    return [table_type.name for table_type in TABLE_TYPES]


PRESETS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            name="smoke", workloads=2400, operations_per_workload=2500, key_domain=32, namespaces=2
        ),
        WorkloadSpec(
            name="tiny", workloads=40, operations_per_workload=500, key_domain=32, namespaces=2
        ),
        WorkloadSpec(
            name="collisions",
            workloads=200,
            operations_per_workload=2000,
            key_domain=48,
            collision_share=0.7,
            initial_capacity=4,
        ),
        WorkloadSpec(
            name="rehash-under-snapshots",
            workloads=100,
            operations_per_workload=5000,
            key_domain=4000,
            namespaces=2,
            initial_capacity=4,
            mix={**DEFAULT_MIX, "put": 60, "remove": 3, "snapshot": 3, "release": 2},
            max_open_snapshots=4,
        ),
        WorkloadSpec(
            name="rehash-snapshots",
            workloads=60,
            operations_per_workload=1500,
            key_domain=4000,
            namespaces=2,
            initial_capacity=4,
            mix={**DEFAULT_MIX, "put": 60, "remove": 2, "snapshot": 0, "release": 3},
            max_open_snapshots=4,
            snapshot_placement="in-rehash",
        ),
        WorkloadSpec(
            name="tables",
            workloads=40,
            operations_per_workload=1500,
            key_domain=256,
            initial_capacity=4,
            mix={**DEFAULT_MIX, "interrupt_iteration": 2},
            implementations=_table_implementations(),
        ),
        WorkloadSpec(
            name="zipf-hot-keys",
            workloads=200,
            operations_per_workload=2500,
            key_domain=2000,
            key_distribution="zipf",
            zipf_exponent=1.2,
        ),
        WorkloadSpec(
            name="long-lived-snapshots",
            workloads=150,
            operations_per_workload=4000,
            key_domain=256,
            max_open_snapshots=8,
            release_order="fifo",
            mix={**DEFAULT_MIX, "snapshot": 1, "release": 0.5},
        ),
    )
}


def preset(name: str) -> WorkloadSpec:
    """The preset called ``name``."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"expected a preset among {sorted(PRESETS)}, got {name!r}") from None


def workload_seed(spec: WorkloadSpec, index: int) -> str:
    """The seed of workload ``index`` (a string: stable across processes)."""
    return f"cowstate:{spec.base_seed}:{index}"


def operations(spec: WorkloadSpec, index: int) -> list[Operation]:
    """The operations of workload ``index`` of ``spec`` (deterministic)."""
    rng = random.Random(workload_seed(spec, index))
    names = [n for n in OPERATIONS if spec.mix.get(n, 0) > 0]
    cumulative = list(itertools.accumulate(spec.mix[n] for n in names))
    draw_key = _key_sampler(spec, rng)
    namespaces = [f"ns{i}" for i in range(spec.namespaces)]
    growth = _Growth(spec.initial_capacity) if spec.snapshot_placement == "in-rehash" else None
    open_snapshots = 0
    ops: list[Operation] = []
    while len(ops) < spec.operations_per_workload:
        name = names[
            bisect.bisect_right(cumulative, rng.random() * cumulative[-1]) if len(names) > 1 else 0
        ]
        if growth is not None:
            if name == "snapshot":
                continue  # only where a rehash runs, below
            if growth.stepped_rehash() and rng.random() < 0.5:
                name = "snapshot"
        if name == "snapshot" and open_snapshots >= spec.max_open_snapshots:
            name = "release"
        if name == "release":
            if open_snapshots == 0:
                continue
            position = {
                "fifo": 0,
                "lifo": open_snapshots - 1,
                "random": rng.randrange(open_snapshots),
            }[spec.release_order]
            ops.append(("release", position))
            open_snapshots -= 1
        elif name == "snapshot":
            ops.append(("snapshot",))
            open_snapshots += 1
        elif name in ("iterate",):
            ops.append((name,))
        elif name == "keys":
            ops.append((name, rng.choice(namespaces)))
        elif name == "interrupt_iteration":
            taken, keyed = rng.randrange(64), rng.choice(INTERRUPTIONS)
            key, namespace = draw_key(), rng.choice(namespaces)
            state = _state(spec, rng) if keyed == "put" else None
            ops.append((name, taken, keyed, key, namespace, state))
            if growth is not None:
                growth.keyed(keyed, (key, namespace))
        else:
            key, namespace = draw_key(), rng.choice(namespaces)
            if name in ("put", "put_and_get_old"):
                ops.append((name, key, namespace, _state(spec, rng)))
            elif name == "get_and_mutate":
                ops.append((name, key, namespace, rng.randrange(100)))
            elif name == "transform":
                ops.append(
                    (name, key, namespace, rng.randrange(10), rng.choice(spec.transform_functions))
                )
            else:
                ops.append((name, key, namespace))
            if growth is not None:
                growth.keyed(name, (key, namespace), ops[-1][-1])
    return ops


#: What each keyed operation does to the key set: +1 inserts, -1 removes.
_KEY_SET_EFFECT = {"put": 1, "put_and_get_old": 1, "remove": -1, "remove_and_get_old": -1}
#: Transform functions that store a state (the others leave the map unchanged).
_STORING_TRANSFORMS = frozenset({"add_or_append", "replace_with_value"})


class _Growth:
    """The map's size and rehashes as the generator foresees them (sizes only,
    no hashes: see the module doc). A table's maps are not followed."""

    def __init__(self, initial_capacity: int) -> None:
        self.live: set[tuple[Any, Any]] = set()
        self.capacity = clamp_capacity(initial_capacity)
        self.steps_left = 0  # keyed operations until the running rehash ends
        self.steps_done = 0

    def stepped_rehash(self) -> bool:
        """True while a rehash runs that took at least one step."""
        return self.steps_left > 0 and self.steps_done > 0

    def keyed(self, name: str, kn: tuple[Any, Any], last: Any = None) -> None:
        """One keyed operation: its rehash step, then what it does to the key set."""
        if self.steps_left:
            self.steps_left -= 1
            self.steps_done += 1
            if not self.steps_left:
                self.capacity *= 2
        effect = _KEY_SET_EFFECT.get(name, 0)
        if name == "transform" and last in _STORING_TRANSFORMS:
            effect = 1
        if effect > 0 and kn not in self.live:
            if not self.steps_left and len(self.live) > threshold_for(self.capacity):
                self.steps_left, self.steps_done = -(-len(self.live) // 4), 0
            self.live.add(kn)
        elif effect < 0:
            self.live.discard(kn)


def _key_sampler(spec: WorkloadSpec, rng: random.Random) -> Any:
    domain = spec.key_domain
    if spec.key_distribution == "zipf":
        weights = itertools.accumulate(
            1.0 / (rank**spec.zipf_exponent) for rank in range(1, domain + 1)
        )
        cumulative = list(weights)

        def index() -> int:
            return bisect.bisect_right(cumulative, rng.random() * cumulative[-1]) % domain
    elif spec.key_distribution == "hot-set":

        def index() -> int:
            if rng.random() < spec.hot_set_share:
                return rng.randrange(spec.hot_set_size)
            return rng.randrange(domain)
    else:

        def index() -> int:
            return rng.randrange(domain)

    threshold = round(spec.collision_share * 1000)

    def key() -> Any:
        i = index()
        if (i * 2654435761) % 1000 < threshold:
            return HashKey(i, i % 4)  # many keys, four hashes: long chains
        return i if i % 2 else f"k{i}"

    return key


def _state(spec: WorkloadSpec, rng: random.Random) -> Any:
    kind = rng.choice(spec.state_kinds)
    value = rng.randrange(1000)
    if kind == "int":
        return value
    if kind == "str":
        return f"s{value}"
    if kind == "list":
        return [value]
    return {"v": value}


def encode(op: Operation) -> list[Any]:
    """A JSON-ready form of ``op``."""
    return [_encode_value(v) for v in op]


def decode(data: Sequence[Any]) -> Operation:
    """The operation :func:`encode` encoded."""
    return tuple(_decode_value(v) for v in data)


def _encode_value(value: Any) -> Any:
    if isinstance(value, HashKey):
        return {"HashKey": [value.value, value.hash_value]}
    return value


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"HashKey"}:
        inner, h = value["HashKey"]
        return HashKey(inner, h)
    return value
