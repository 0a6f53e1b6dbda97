"""How ``make test`` hands the suite to its pytest-xdist workers.

``make pytest`` runs ``--dist loadgroup --no-loadscope-reorder``, and
``tests/conftest.py`` replaces xdist's group scheduler by
:class:`GroupScheduling`: xdist hands out *groups* (every test of one group
runs in one worker) in collection order, each worker taking the next when it
has two tests or fewer left. :func:`schedule` (conftest's
``pytest_collection_modifyitems``, in every worker alike) sorts the groups
heaviest first, so the long tests start at once and the short ones fill in
beside them, instead of one worker running the last long file alone while
the other idles. (xdist's own ``xdist_group`` marks do not work under
pytest 9: xdist 3.8 renames a marked test's ``_nodeid``, which pytest 9 no
longer reads; the group here comes from the node id itself.)

Rules:

G1. A test's group is its file, unless the file is in :data:`SPLIT`: tests
    of one file may share a module fixture (a Spark cluster, a fuzzer's
    corpus) or a per-process cache, which a group keeps in one process.
G2. A file in :data:`SPLIT` is split by the key it names: its tests share
    nothing, or share only with the tests of their own key (the every-class
    hunt of a bug and the identity control that reuses its count).
G3. A group weighs the sum of its tests' :data:`SECONDS`, 0.2 s for a test
    not listed; heavier groups come first, ties in collection order. The
    weights are measured (``--durations``, 2026-11-27); a wrong one only
    costs time, never a test.
G4. The files of :data:`LAST` go late, whatever they weigh: after the
    heavier groups, with the lightest groups -- at least (workers - 1)
    times their own weight -- still to come, so the other workers stay busy
    while they run. Their tests time a process's reaction to a signal, and
    ``make test`` runs mypy, CrossHair and ``make sanitize`` beside the
    suite's first minutes (at a load of 8 Ctrl-C "before Spark is up" once
    ended the run by the signal instead of status 130; split over three
    workers, the Ctrl-C tests met each other's Spark and the flake came
    back). Handed out last, they ran alone for their 60 s while two workers
    idled (measured 2026-11-27: one worker ended 55 s after the others).
    That flake's cause was not the load but where the signal landed (a
    dataclass being made: ``cowstate_spec.interrupt``, rule 5, fixed
    2026-11-28); whether these files may now go earlier is not measured.
G5. A test listed in :data:`SHARES` joins the group of the test it names:
    it reuses that test's run, which only a test in the same process can
    (``cowstate_spec.coverage.run_counted``: the coverage tests count the
    rare paths of the machine tests' own ``ci`` runs).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pytest
from xdist.scheduler import LoadScopeScheduling

_PARAMETERS = re.compile(r"\[(.*)\]$")


def _by_test(nodeid: str) -> str:
    return nodeid


def _by_parameters(nodeid: str) -> str:
    """The test's parameters: a hunt and its control share the bug's id."""
    found = _PARAMETERS.search(nodeid)
    return found.group(1) if found else nodeid


#: G2: the files split into groups, and each test's key within its file.
SPLIT: dict[str, Callable[[str], str]] = {
    "test_spec_catches_every_class.py": _by_parameters,
    "test_storage_machine.py": _by_test,
    "test_backend_machine.py": _by_test,
    "test_state_machine.py": _by_test,
    "test_checkpoint_rules.py": _by_test,
    "test_spec_catches_bad_key_contexts.py": _by_test,
    "test_coverage_events.py": _by_test,
    "test_flink_map_scenarios.py": _by_test,
}

#: G3: measured seconds of the tests over 5 s (``--durations``, two workers,
#: 2026-11-27), by a test id's prefix: every parametrization of it that the
#: prefix matches.
SECONDS: dict[str, float] = {
    "test_cluster.py::": 20.0,  # its 4 tests (2 in the reduced form): one cluster run, ~70 s
    "test_backend_machine.py::test_backend_agrees_with_the_model[rocksdb-": 17.0,  # 30 examples
    "test_storage_machine.py::test_storage_agrees_with_the_model[rocksdb-2]": 31.0,
    "test_storage_machine.py::test_storage_agrees_with_the_model[rocksdb-1]": 25.0,
    "test_fuzz.py::": 5.0,
    "test_fuzz.py::test_reduced_file_run": 26.0,
    "test_fuzz.py::test_reduced_directory_run": 9.0,
    "test_cli_errors.py::test_ctrl_c_whenever_it_comes": 10.0,
    "test_cli_errors.py::test_a_job_failing_on_the_executors": 16.0,
    "test_user_code_errors.py::test_the_backend_machine_with_hostile_user_code_agrees_"
    "with_the_model[rocksdb]": 10.0,
    "test_checkpoint_rules.py::test_a_crash_at_any_write_leaves_the_last_completed_"
    "checkpoint_restorable[rocksdb]": 18.0,
    "test_spark.py::": 8.0,
    "test_spec_catches_every_class.py::test_the_storage_machine_catches_within_ci": 3.0,
    "test_spec_catches_every_class.py::test_the_storage_machine_passes_the_identity_rewrite": 6.0,
    "test_spec_catches_every_class.py::test_the_backend_machine_": 4.0,
    "test_flink_map_scenarios.py::test_random_modifications_keep_snapshots_isolated_20": 8.0,
    "test_backend_machine.py::test_backend_agrees_with_the_model": 11.0,
    "test_backend_machine.py::test_heap_incremental": 7.0,
    "test_state_machine.py::test_implementation_agrees_with_the_model": 6.0,
    # the runs the coverage test counts (G5: it joins their groups), at every example
    "test_state_machine.py::test_implementation_agrees_with_the_model[cow-table]": 20.0,
    "test_state_machine.py::test_implementation_agrees_with_the_model[c-map]": 16.0,
    "test_state_machine.py::test_implementation_agrees_with_the_model[cow-map]": 16.0,
    "test_mutation_timeouts.py::test_the_timeout_follows": 10.0,
    "test_value_codec.py::test_mutated_encodings_never_escape": 9.0,
    "test_storage_machine.py::test_storage_agrees_with_the_model[heap-": 8.0,
    "test_storage_machine.py::test_heap_incremental_storage": 6.0,
    "test_c_codec.py::test_mutated_encodings_decode": 8.0,
    "test_spec_catches_every_class.py::test_the_map_machine_catches_within_ci"
    "[get-mutation-not-recorded]": 9.0,
}
UNLISTED = 0.2

#: G5: a test that reuses another's run, and that test.
SHARES: dict[str, str] = {
    f"test_coverage_events.py::test_machine_reaches_the_rare_paths[{name}]": (
        f"test_state_machine.py::test_implementation_agrees_with_the_model[{name}]"
    )
    for name in ("cow-map", "c-map", "cow-table")
} | {
    "test_coverage_events.py::test_backend_machine_has_the_owner_meet_the_writer": (
        "test_backend_machine.py::test_backend_agrees_with_the_model"
        "[heap-cow-pure-KeyGroupRange(0, 7)]"
    )
}
#: G4: run late, with about their own weight of lighter groups left per
#: other worker.
LAST = frozenset({"test_cli_errors.py"})
#: G4: the workers when xdist does not say (``make pytest``'s PYTEST_JOBS).
DEFAULT_WORKERS = 3


def seconds(nodeid: str) -> float:
    """G3: the weight of the test ``nodeid`` (``tests/`` left off): the
    longest prefix of :data:`SECONDS` it starts with."""
    matching = [prefix for prefix in SECONDS if nodeid.startswith(prefix)]
    return SECONDS[max(matching, key=len)] if matching else UNLISTED


def group_of(nodeid: str) -> str:
    """G1, G2, G5: the group of the test ``nodeid`` (``tests/`` left off)."""
    nodeid = SHARES.get(nodeid, nodeid)
    file = _file_of(nodeid)
    split = SPLIT.get(file)
    return f"{file}::{split(nodeid)}" if split else file


def schedule(items: list[pytest.Item], workers: int | None = None) -> None:
    """Sort ``items`` heaviest group first (G3), :data:`LAST` late (G4), each
    group in one piece, in place. ``workers``: xdist's worker count (its
    PYTEST_XDIST_WORKER_COUNT), else :data:`DEFAULT_WORKERS`."""
    if workers is None:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", DEFAULT_WORKERS))
    weights: dict[str, float] = {}
    groups: list[str] = []
    for item in items:
        nodeid = _relative(item.nodeid)
        group = group_of(nodeid)
        groups.append(group)
        weights[group] = weights.get(group, 0.0) + seconds(nodeid)
    first_seen = {group: index for index, group in reversed(list(enumerate(groups)))}
    ranked = sorted(weights, key=lambda group: (-weights[group], first_seen[group]))
    late = [group for group in ranked if _file_of(group) in LAST]
    others = [group for group in ranked if _file_of(group) not in LAST]
    # G4: walk back from the lightest until the tail weighs (workers - 1)
    # times the late groups, and put them before that tail.
    wanted = (workers - 1) * sum(weights[group] for group in late)
    cut, tail = len(others), 0.0
    while cut > 0 and tail < wanted - 1e-9:  # sums of 0.2 s weights are inexact
        cut -= 1
        tail += weights[others[cut]]
    position = {group: rank for rank, group in enumerate([*others[:cut], *late, *others[cut:]])}
    order = sorted(range(len(items)), key=lambda i: (position[groups[i]], i))
    items[:] = [items[i] for i in order]


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no py.typed
    """xdist's scope scheduling with :func:`group_of` as the scope (G1, G2)."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(_relative(nodeid))


def _relative(nodeid: str) -> str:
    return nodeid.removeprefix("tests/")


def _file_of(nodeid: str) -> str:
    """The test file of a node id (or of a group: it starts with its file)."""
    return nodeid.split("::", 1)[0]
