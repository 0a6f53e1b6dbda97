"""The in-process differential runner: deterministic, silent on the real map,
loud on broken ones, and an implementation's exception is a divergence."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from cowstate import CopyOnWriteStateMap
from cowstate_spec.bad_implementations import BUGS, bad_implementation
from cowstate_spec.cli import main
from cowstate_spec.differential import generate, run_workload
from cowstate_spec.implementations import IMPLEMENTATIONS, Implementation


def test_generation_is_identical_across_hash_seeds() -> None:
    code = "from cowstate_spec.differential import generate; print(repr(generate(7, 300)))"
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("0", "1", "12345")
    }
    assert len(outputs) == 1
    assert outputs.pop().strip() == repr(generate(7, 300))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=repr)
def test_real_implementations_never_diverge(implementation: Implementation) -> None:
    for seed in range(3):
        result = run_workload(implementation, generate(seed, 1500), seed)
        assert not result.diverged, (result.divergence_operation, result.actual)
        assert result.applied == 1500
        assert sum(result.operation_counts.values()) == 1500


@pytest.mark.parametrize("bug", [b for b in BUGS if b.name in {
    "get-skips-state-copy", "remove-relinks-shared-predecessor",
    "rehash-relinks-shared-entries", "put-and-get-old-returns-shared-state", "never-grows"}],
    ids=lambda b: b.name)
def test_broken_implementations_diverge(bug: Any) -> None:
    result = run_workload(bad_implementation(bug), generate(1, 2000), 1)
    assert result.diverged
    assert result.divergence_at is not None and result.applied == result.divergence_at
    assert result.expected and result.actual


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


def test_check_command_reports_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--workloads", "2", "--ops", "300"]) == 0
    out = capsys.readouterr().out
    assert "operations checked: 1,200" in out
    assert "divergences       : 0" in out
