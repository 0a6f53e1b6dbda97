"""The process protocol (docs/protocol.md): the differential runner through a
child process.

- the reference adapter (the C map behind the protocol) agrees with the model
  over every map preset, reduced, with the in-process run's results and rare
  paths;
- planted bugs are caught through the protocol: cowstate's own behind the
  reference adapter, and those of a tiny copy-on-write map written from the
  page alone (tests/tiny_cow_map.py, which imports nothing of cowstate), with
  its bug-free build as the identity control;
- a child that cannot start, dies, hangs, answers garbage or speaks another
  version stops the run with one line naming the implementation;
- the page's worked exchange is what the reference adapter answers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cowstate_spec import process_impl
from cowstate_spec.cli import main
from cowstate_spec.conformance import CHECKS, skipped_checks
from cowstate_spec.differential import SNAPSHOT_IN_REHASH, run_workload
from cowstate_spec.implementations import by_name
from cowstate_spec.protocol import ProtocolError
from cowstate_spec.workloads import PRESETS, WorkloadSpec, operations, preset

ROOT = Path(__file__).resolve().parents[1]
TINY_MAP = Path(__file__).resolve().parent / "tiny_cow_map.py"
REFERENCE = "cmap-process"
#: Every preset of maps, reduced to one workload of 600 operations.
MAP_PRESETS = [name for name, spec in sorted(PRESETS.items()) if name != "tables"]


def reduced(name: str) -> WorkloadSpec:
    return preset(name).model_copy(update={"operations_per_workload": 600})


def run(name: str, spec: WorkloadSpec, index: int = 0) -> Any:
    return run_workload(
        by_name(name),
        operations(spec, index),
        workload=index,
        check_every=spec.check_every,
        initial_capacity=spec.initial_capacity,
    )


# ------------------------------------------------------------ the reference


@pytest.mark.parametrize("name", MAP_PRESETS)
def test_the_reference_adapter_agrees_with_the_model_as_the_map_does_in_process(
    name: str,
) -> None:
    spec = reduced(name)
    through = run(REFERENCE, spec)
    assert not through.diverged, (through.divergence_operation, through.expected, through.actual)
    in_process = run("c-map", spec)
    assert through.operation_counts == in_process.operation_counts
    assert through.applied == spec.operations_per_workload
    if os.environ.get("PYTHONHASHSEED") == "0":  # the child hashes strings as this process
        assert through.events == in_process.events


def test_the_reference_adapter_meets_the_rehash_and_skips_only_the_lifetimes() -> None:
    """Every check runs through the protocol but the states' lifetimes: the
    child's objects are out of this process's reach (frees_states)."""
    spec = reduced("rehash-snapshots")
    assert run(REFERENCE, spec).events.get(SNAPSHOT_IN_REHASH, 0) > 0
    assert skipped_checks(by_name(REFERENCE)) == [CHECKS["frees_states"]]


@pytest.mark.parametrize(
    "bug",
    [
        "get-skips-state-copy",
        "remove-relinks-shared-predecessor",
        "iterator-ignores-mod-count",
        "never-grows",
    ],
)
def test_cowstates_planted_bugs_are_caught_through_the_protocol(bug: str) -> None:
    spec = WorkloadSpec(name="small", workloads=3, operations_per_workload=1500)
    name = f"process:{{python}} -m cowstate_spec.adapters.cmap --implementation bad-{bug}"
    assert any(run(name, spec, index).diverged for index in range(spec.workloads))


# ------------------------------------------------- a map written from the page


def tiny(bug: str | None = None) -> str:
    return f"process:{{python}} {TINY_MAP}" + (f" --bug {bug}" if bug else "")


def first_divergence(name: str, workloads: int = 4) -> Any:
    spec = preset("tiny")
    for index in range(workloads):
        result = run(name, spec, index)
        if result.diverged:
            return result
    return None


@pytest.mark.parametrize(
    "bug, expected",
    [
        ("get-skips-state-copy", "to hand out a copy (an open snapshot holds the stored state"),
        ("remove-relinks-shared-predecessor", "snapshot "),
        ("copy-without-snapshot", "to hand out the stored object"),
    ],
)
def test_planted_bugs_of_a_second_implementation_are_caught_through_the_protocol(
    bug: str, expected: str
) -> None:
    found = first_divergence(tiny(bug))
    assert found is not None
    assert expected in found.expected


def test_the_tiny_map_without_a_bug_agrees_with_the_model() -> None:
    """The identity control of the planted bugs above: the same workloads, and
    more, agree with the bug-free build."""
    assert first_divergence(tiny(), workloads=8) is None
    assert skipped_checks(by_name(tiny())) != []  # no structure, no visible rehash


def test_a_copy_without_a_snapshot_is_caught_only_by_the_handles() -> None:
    """The values of copy-without-snapshot agree with the model: only rule 4
    of cowstate_spec.process_impl (state identity) sees the needless copy."""
    name = tiny("copy-without-snapshot")
    implementation = by_name(name)
    blind = process_impl.ProcessImplementation(
        implementation.name,
        implementation.factory,
        capabilities=implementation.capabilities,
        state_handles=False,
    )
    spec = preset("tiny")
    for index in range(4):
        result = run_workload(blind, operations(spec, index), initial_capacity=4)
        assert not result.diverged, result.expected


# ------------------------------------------------------------------ failures


def child(tmp_path: Path, body: str) -> str:
    """A process implementation running ``body`` (Python) as its child."""
    script = tmp_path / "child.py"
    script.write_text("import json, sys, time\n" + body)
    return f"process:{{python}} {script}"


def says(message: str) -> str:
    """Child code: read a line, then print ``message`` (a Python expression) as JSON."""
    return f"sys.stdin.readline(); print(json.dumps({message}), flush=True)\n"


HELLO = says('{"id": 1, "hello": {"protocol": 1}}')


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "sys.stderr.write('no map here\\n'); sys.exit(4)\n",
            "exited with status 4 (its last line on stderr: no map here)",
        ),
        (
            "sys.stdin.readline(); print('hello there', flush=True)\n",
            "answered hello there; expected a JSON protocol line with id 1",
        ),
        (says('{"id": 1, "hello": {"protocol": 2}}'), "speaks protocol version 2, expected 1"),
        (says('{"id": 1, "error": "only version 3"}'), "refused a request: only version 3"),
        (
            says('{"id": 1, "hello": {"protocol": 1, "capabilities": {"teleport": True}}}'),
            "offered capabilities {'teleport': True}",
        ),
        (HELLO + "sys.stdin.readline(); sys.exit(0)\n", "exited with status 0"),
        (
            HELLO + says('{"id": 2, "results": [None], "sizes": [0]}') + "sys.stdin.readline()\n",
            "answered 1 of",
        ),
    ],
    ids=["dies", "garbage", "version", "refuses-version", "capability", "dies-mid-run", "short"],
)
def test_a_child_that_cannot_be_checked_stops_the_run_with_one_line(
    tmp_path: Path, body: str, message: str
) -> None:
    name = child(tmp_path, body)
    with pytest.raises(ProtocolError) as caught:
        run(name, preset("tiny"))
    text = str(caught.value)
    process_impl.forget(name)
    assert text.startswith(f"implementation {name}")
    assert message in text
    assert "\n" not in text


def test_a_child_that_stops_answering_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_impl, "TIMEOUT", 0.5)
    name = child(tmp_path, HELLO + "time.sleep(30)\n")
    with pytest.raises(ProtocolError, match=r"did not answer within 0.5 s"):
        run(name, preset("tiny"))
    process_impl.forget(name)


def test_a_crash_inside_the_map_is_a_divergence_with_its_trace(tmp_path: Path) -> None:
    name = child(
        tmp_path,
        HELLO
        + 'crash = {"error": "crashed", "message": "Traceback: NullPointerException"}\n'
        + says('{"id": 2, "results": [None, crash], "sizes": [0, 0]}')
        + "sys.stdin.readline()\n",
    )
    result = run(name, preset("tiny"))
    process_impl.forget(name)
    assert result.divergence_at == 0
    assert result.expected == "no exception" and "NullPointerException" in result.actual


def test_cowstate_check_names_the_implementation_in_one_line_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = child(tmp_path, "sys.exit(9)\n")
    arguments = ["--preset", "tiny", "--master", "in-process", "--out", str(tmp_path / "out")]
    assert main(["check", *arguments, "--implementation", name]) == 3
    error = capsys.readouterr().err
    process_impl.forget(name)
    assert error == f"cowstate check: implementation {name} exited with status 9\n"


def test_flink_java_without_its_build_says_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(process_impl, "FLINK_ADAPTER_DIR", tmp_path)
    with pytest.raises(ProtocolError, match=r"run `make flink-adapter` \(needs Java 17"):
        process_impl.flink_adapter_command()


# ------------------------------------------------------------------ the page


def test_the_worked_exchange_of_the_page_is_what_the_reference_adapter_answers() -> None:
    page = (ROOT / "docs" / "protocol.md").read_text()
    exchange = page[page.index("## A worked exchange") :]
    requests = [json.loads(line[2:]) for line in exchange.splitlines() if line.startswith("> ")]
    documented = [json.loads(line[2:]) for line in exchange.splitlines() if line.startswith("< ")]
    assert len(requests) == len(documented) == 2
    answered = subprocess.run(
        [sys.executable, "-m", "cowstate_spec.adapters.cmap"],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for request, doc, line in zip(requests, documented, answered, strict=True):
        got = json.loads(line)
        if "ops" in request:
            got, doc = canonical(request["ops"], got), canonical(request["ops"], doc)
        assert got == doc


def canonical(ops: list[Any], answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with handles renumbered in order of appearance and error
    messages cut to their kind (the page shortens both)."""
    names: dict[Any, int] = {}

    def handle(h: Any) -> int:
        return names.setdefault(h, len(names) + 1)

    def held(r: Any) -> Any:
        return None if r is None else [handle(r[0]), r[1]]

    results = []
    for op, r in zip(ops, answer["results"], strict=True):
        name = op[0]
        if isinstance(r, dict):
            r = {"error": r["error"]}
        elif name == "put":
            r = [r[0], handle(r[1])]
        elif name in ("get", "get_and_mutate", "remove_and_get_old"):
            r = held(r)
        elif name == "put_and_get_old":
            r = [held(r[0]), handle(r[1])]
        elif name == "transform":
            r = [None if r[0] is None else handle(r[0]), handle(r[1])]
        results.append(r)
    return {**answer, "results": results}


def test_the_page_lists_every_operation_of_the_protocol() -> None:
    page = (ROOT / "docs" / "protocol.md").read_text()
    listed = set(re.findall(r'^\| `\["(\w+)"', page, flags=re.MULTILINE))
    from cowstate_spec.protocol import OPERATIONS

    assert listed == set(OPERATIONS)
