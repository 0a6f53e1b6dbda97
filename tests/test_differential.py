"""Workload specs, the generator, the runner and the minimizer (no Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cowstate.state_map import CopyOnWriteStateMap
from cowstate_spec.differential import load_trace, minimize, run_workload, write_trace
from cowstate_spec.implementations import IMPLEMENTATIONS, Implementation, by_name
from cowstate_spec.keys import HashKey
from cowstate_spec.workloads import PRESETS, WorkloadSpec, decode, encode, operations, preset

SMALL = WorkloadSpec(name="small", workloads=3, operations_per_workload=1500)


# ------------------------------------------------------------------ specs


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_json_and_yaml(name: str, tmp_path: Path) -> None:
    spec = preset(name)
    for suffix in (".json", ".yaml"):
        path = tmp_path / f"{name}{suffix}"
        spec.save(path)
        assert WorkloadSpec.load(path) == spec


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("workloads", 0, "greater than or equal to 1"),
        ("mix", {"put": -1.0}, "weights >= 0"),
        ("mix", {"frobnicate": 1.0}, "operations among"),
        ("mix", {"snapshot": 1.0}, "at least one map operation"),
        ("key_distribution", "gaussian", "'uniform', 'zipf' or 'hot-set'"),
        ("collision_share", 1.5, "less than or equal to 1"),
        ("implementations", ["no-such-map"], "no-such-map"),
        ("release_order", "sideways", "'fifo', 'lifo' or 'random'"),
        ("state_kinds", [], "at least 1 item"),
        ("surprise", 1, "Extra inputs are not permitted"),
    ],
)
def test_invalid_specs_are_rejected_with_field_messages(
    field: str, value: Any, fragment: str
) -> None:
    with pytest.raises(ValidationError) as excinfo:
        WorkloadSpec.model_validate({field: value})
    assert field in str(excinfo.value)
    assert fragment in str(excinfo.value)


def test_hot_set_must_fit_in_the_key_domain() -> None:
    with pytest.raises(ValidationError, match="hot_set_size <= key_domain"):
        WorkloadSpec(key_distribution="hot-set", key_domain=4, hot_set_size=8)


# ------------------------------------------------------------- generator


def test_generation_is_identical_across_hash_seeds() -> None:
    code = (
        "from cowstate_spec.workloads import preset, operations;"
        "print(repr(operations(preset('collisions'), 5)))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("0", "1", "12345")
    }
    assert len(outputs) == 1
    assert outputs.pop().strip() == repr(operations(preset("collisions"), 5))


def test_same_index_same_operations_other_index_other_operations() -> None:
    spec = preset("smoke")
    assert operations(spec, 3) == operations(spec, 3)
    assert operations(spec, 3) != operations(spec, 4)
    assert len(operations(spec, 3)) == spec.operations_per_workload


def test_generator_respects_open_snapshot_limit_and_release_order() -> None:
    spec = WorkloadSpec(
        max_open_snapshots=2,
        release_order="lifo",
        operations_per_workload=3000,
        mix={"put": 1, "snapshot": 5, "release": 1},
    )
    open_count = 0
    for op in operations(spec, 0):
        if op[0] == "snapshot":
            open_count += 1
            assert open_count <= 2
        elif op[0] == "release":
            assert op[1] == open_count - 1  # lifo: the newest
            open_count -= 1
    fifo = spec.model_copy(update={"release_order": "fifo"})
    assert all(op[1] == 0 for op in operations(fifo, 0) if op[0] == "release")


def test_zipf_keys_are_skewed_and_collisions_are_hash_keys() -> None:
    spec = WorkloadSpec(
        key_distribution="zipf",
        zipf_exponent=1.5,
        key_domain=1000,
        collision_share=0.0,
        operations_per_workload=4000,
    )
    keys = [op[1] for op in operations(spec, 0) if op[0] == "put"]
    top = max(set(keys), key=keys.count)
    assert keys.count(top) > len(keys) * 0.1
    colliding = WorkloadSpec(collision_share=1.0, operations_per_workload=500)
    assert all(isinstance(op[1], HashKey) for op in operations(colliding, 0) if op[0] == "put")


def test_transform_functions_limit_what_transforms_apply_and_default_to_all() -> None:
    spec = WorkloadSpec(operations_per_workload=3000, mix={"put": 1, "transform": 3})
    every = {op[4] for op in operations(spec, 0) if op[0] == "transform"}
    assert every == {"add_or_append", "replace_with_value", "raise_error", "return_none"}
    succeeding = spec.model_copy(update={"transform_functions": ["add_or_append"]})
    assert {op[4] for op in operations(succeeding, 0) if op[0] == "transform"} == {"add_or_append"}
    with pytest.raises(ValidationError, match="transform_functions"):
        WorkloadSpec(transform_functions=["explode"])


def test_operations_encode_to_json_and_back() -> None:
    ops = operations(preset("collisions"), 1)
    assert [decode(json.loads(json.dumps(encode(op)))) for op in ops] == ops


# ---------------------------------------------------------------- runner


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=repr)
def test_real_implementations_never_diverge(implementation: Implementation) -> None:
    for index in range(SMALL.workloads):
        result = run_workload(implementation, operations(SMALL, index), check_every=50)
        assert not result.diverged, (result.divergence_operation, result.actual)
        assert result.applied == SMALL.operations_per_workload
        assert sum(result.operation_counts.values()) == result.applied


@pytest.mark.parametrize(
    "bug",
    [
        "get-skips-state-copy",
        "remove-relinks-shared-predecessor",
        "rehash-relinks-shared-entries",
        "put-and-get-old-returns-shared-state",
        "never-grows",
    ],
)
def test_broken_implementations_diverge(bug: str) -> None:
    result = run_workload(by_name(f"bad-{bug}"), operations(SMALL, 1), check_every=50)
    assert result.diverged
    assert result.divergence_at is not None
    assert result.divergence_at <= result.applied <= result.divergence_at + 1
    assert result.expected and result.actual and result.divergence_operation


class ExplodingMap(CopyOnWriteStateMap[Any, Any, Any]):
    __slots__ = ()

    def contains_key(self, key: Any, namespace: Any) -> bool:
        raise ZeroDivisionError("inside the implementation")


def test_an_exception_inside_the_implementation_is_a_divergence_with_traceback() -> None:
    exploding = Implementation("exploding", ExplodingMap)
    ops = [("put", 1, "ns0", 5), ("contains_key", 1, "ns0"), ("get", 1, "ns0")]
    result = run_workload(exploding, ops)
    assert result.divergence_at == 1
    assert result.actual is not None and "ZeroDivisionError" in result.actual
    assert "Traceback" in result.actual


class LeakyMap(CopyOnWriteStateMap[Any, Any, Any]):
    """Refuses None with a bare ValueError instead of a cowstate.errors one."""

    __slots__ = ()

    def put(self, key: Any, namespace: Any, state: Any) -> bool:
        if state is None:
            raise ValueError("no")
        return super().put(key, namespace, state)


def test_a_refusal_outside_the_error_hierarchy_is_a_divergence() -> None:
    result = run_workload(Implementation("leaky", LeakyMap), [("put", 1, "ns0", None)])
    assert result.divergence_at == 0
    assert result.actual is not None and "ValueError" in result.actual


# ------------------------------------------------------------- minimizer


def test_minimizer_shrinks_to_a_short_locally_minimal_diverging_list(tmp_path: Path) -> None:
    bad = by_name("bad-get-skips-state-copy")
    ops = operations(SMALL, 1)
    minimal = minimize(bad, ops)
    assert 0 < len(minimal) <= 15
    assert run_workload(bad, minimal, check_every=1).diverged
    for i in range(len(minimal)):  # 1-minimal
        assert not run_workload(bad, minimal[:i] + minimal[i + 1 :], check_every=1).diverged
    assert not run_workload(by_name("cow-map"), minimal, check_every=1).diverged

    result = run_workload(bad, minimal, check_every=1, seed="s")
    trace, test = write_trace(tmp_path / "traces", tmp_path / "regressions", bad, minimal, result)
    name, replayed, capacity = load_trace(trace)
    assert (name, replayed, capacity) == (bad.name, minimal, None)
    assert test is not None
    outcome = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True,
        text=True,
    )
    assert outcome.returncode == 1 and "1 failed" in outcome.stdout  # the bug is still there


def test_minimizer_refuses_a_workload_that_agrees() -> None:
    with pytest.raises(ValueError, match="diverging"):
        minimize(by_name("cow-map"), operations(SMALL, 0)[:50])
