"""The backend state machine over every backend of cowstate_spec.backends, with
asynchronous writers forced to interleave with the owner thread.

The runs over the backends of :data:`REDUCED` take at most the share of the
profile's examples it names. Measured under ``ci`` (2026-11-28, coverage.py
with branches over ``cowstate`` and ``cowstate_model``, gcov over the C
code), RocksDB's two runs at a quarter (30 each, over every key group and
over a sub-range; they ran 60 each) and the nested heap backend's run over
every key group at a half (60; it ran 120) reach together with the other
runs every line and branch of the Python packages and of the C code the
runs reached before. RocksDB's hostile machine (tests/test_user_code_errors.py)
keeps its examples, and the bugs planted in the backends' layers are hunted
with their own budgets (tests/test_spec_catches_bad_backends.py).
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import settings

from cowstate.key_groups import KeyGroupRange
from cowstate_spec.backend_machine import MAX_PARALLELISM, backend_machine_for
from cowstate_spec.backends import BACKENDS, HEAP_INCREMENTAL, BackendImplementation, WriteGate
from cowstate_spec.bad_layers import BACKEND_LAYER_BUGS, bad_layer_backend_machine
from cowstate_spec.coverage import run_counted

RANGES = [KeyGroupRange(0, MAX_PARALLELISM - 1), KeyGroupRange(2, 6)]
#: The share of the profile's examples a backend's runs take at most (see
#: the module doc).
REDUCED = {"rocksdb": 1 / 4, "heap-nested": 1 / 2}


@pytest.mark.parametrize("key_group_range", RANGES, ids=repr)
@pytest.mark.parametrize("implementation", BACKENDS, ids=repr)
def test_backend_agrees_with_the_model(
    implementation: BackendImplementation,
    key_group_range: KeyGroupRange,
    forced_interleavings: None,
) -> None:
    # Twice the profile's steps: a snapshot, mutations while it is written,
    # its completion and a restore from it need room in one run. RocksDB's
    # steps cost three times the heap's (a database opened per restore and
    # per snapshot: its example_share is a half), and a sub-range repeats the
    # full range's runs but for its restores: each runs half the profile's
    # examples, to keep make test within its 15 minutes (make deep: the deep
    # profile's half, 2,000 runs); RocksDB's runs a quarter, the nested heap
    # backend's a half over every key group too (REDUCED: 30 and 60 under ci).
    # (Through run_counted: the coverage test reuses the heap-cow-pure run.)
    current = settings()
    share = min(
        implementation.example_share,
        1.0 if key_group_range == RANGES[0] else 0.5,
        REDUCED.get(implementation.name, 1.0),
    )
    run_counted(
        backend_machine_for(implementation, key_group_range),
        settings(
            current,
            stateful_step_count=2 * current.stateful_step_count,
            max_examples=round(current.max_examples * share),
        ),
    )


def test_every_reduced_run_names_a_backend() -> None:
    unknown = set(REDUCED) - {b.name for b in BACKENDS}
    assert not unknown, f"REDUCED names no backend: {sorted(unknown)}"


def test_heap_incremental_backend_tracks_what_every_kind_changes(
    forced_interleavings: None,
) -> None:
    # The maps track changes (rules T and D of cowstate.state_map) while every
    # kind's handles write through them and writers race the owner: the
    # machine's ChangeTracking rule takes bases and checks the tracked changes
    # and removals against the model after every step. Over the full range
    # only and the profile's steps (not twice them), for the CI budget.
    run_counted(backend_machine_for(HEAP_INCREMENTAL, RANGES[0]), settings())


# --------------------------------------------- the write gate's driving
# Regression: complete_snapshot_mutating_what_it_reads waited 2 ms for the
# writer at each step and granted a write either way, so a slow writer (a
# fresh process) collected credits and passed the serializer unobserved; the
# shallow-serializer-fast-path hunt then passed its budget in some runs.


def _writer(gate: WriteGate, passes: int, seen: list[int]) -> threading.Thread:
    def run() -> None:
        for index in range(passes):
            time.sleep(0.003 if index % 2 else 0)  # slower than the owner, half the time
            gate.pass_through()
            seen.append(index)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_await_writer_hands_each_write_to_a_writer_already_waiting_for_it() -> None:
    gate, seen = WriteGate(timeout=10.0), list[int]()
    thread = _writer(gate, 6, seen)
    observed: list[int] = []
    while gate.await_writer(lambda: not thread.is_alive(), timeout=10.0):
        observed.append(len(seen))  # the writer stands at the gate: it passed exactly these
        gate.tick()
    thread.join()
    assert observed == list(range(6)), f"the owner saw the writer at {observed}"


def test_await_writer_is_false_once_the_writer_is_done_and_times_out_when_none_comes() -> None:
    gate, seen = WriteGate(timeout=10.0), list[int]()
    gate.open()
    thread = _writer(gate, 2, seen)
    thread.join()
    assert gate.await_writer(lambda: True, timeout=10.0) is False
    with pytest.raises(TimeoutError, match="waited for a writer"):
        WriteGate().await_writer(lambda: False, timeout=0.05)


def test_the_driven_completion_mutates_a_map_state_whose_list_the_writer_reads(
    forced_interleavings: None,
) -> None:
    # The shallow-serializer-fast-path bug shares a map state's lists with a
    # snapshot; fill_every_key_group puts one in a map state of every key
    # group, so the driven completion mutates one while the writer waits to
    # serialize it, at the first try.
    bug = next(b for b in BACKEND_LAYER_BUGS if b.name == "shallow-serializer-fast-path")
    machine = bad_layer_backend_machine(bug, RANGES[0])()
    try:
        machine.load(count=3, family="int")
        machine.fill_every_key_group(value=1)
        # No credit left from these operations: the writer must not run ahead
        # of the rule before it starts (it did once on a loaded machine).
        machine.gate.close()
        machine.snapshot()
        with pytest.raises(AssertionError, match="the model's snapshot at the synchronous moment"):
            machine.complete_snapshot_mutating_what_it_reads(index=0, item=7)
    finally:
        machine.teardown()
