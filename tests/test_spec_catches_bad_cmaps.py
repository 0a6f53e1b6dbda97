"""The specification must catch every deliberately broken C map.

Each bug of cowstate_spec.bad_cmaps is one defect compiled into the C map
(``-DCOWSTATE_BUG=n``, or a text rewrite of a copy of ``_cmap.c``). The map
state machine, run without shrinking, must fail on each, with an assertion (a
model disagreement or a named invariant); so must the differential runner of
``cowstate check`` within a few ``smoke`` workloads. The real C map (and each
rewrite replaced by itself) under the same settings must pass, so the
failures come from the bugs and not from the way the variants are built and
loaded.

Both judge the C map with the probe's checker in C (cowstate_spec.
_cmap_probe); the last test replays each bug with the reference checker (the
structure export read by cowstate_spec.invariants) beside it after every
operation, and requires both to name the same first violation (none for
the bugs no structure shows: BEHAVIOUR_ONLY, LIFETIME_ONLY).
"""

import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate_model import deep_copy
from cowstate_spec.bad_cmaps import (
    C_BUGS,
    C_REWRITES,
    C_TRACKING_REWRITES,
    CBug,
    CRewrite,
    bad_cmap_implementation,
    build_bad_cmap,
    c_identity,
)
from cowstate_spec.cmap_view import C_MAP_CLASS, PROBE
from cowstate_spec.contract import TRANSFORMS, mutate_in_place
from cowstate_spec.differential import run_workload
from cowstate_spec.implementations import Implementation, by_name
from cowstate_spec.invariants import check_map, fingerprint
from cowstate_spec.machine import machine_for
from cowstate_spec.profiles import control_examples, hunt, hunt_settings
from cowstate_spec.workloads import operations, preset

pytestmark = pytest.mark.skipif(
    C_MAP_CLASS is None,
    reason="the C map or its probe is not built (tests/test_implementations.py fails for that)",
)

HUNT = hunt_settings(max_examples=800, stateful_step_count=50)
PLANTED: list[CBug | CRewrite] = [*C_BUGS, *C_REWRITES]
#: The planted bug that breaks no structural invariant but the behaviour: an
#: iterator that goes on after a removal (the machine's and the runner's
#: iteration rules see it).
BEHAVIOUR_ONLY = {"c-remove-skips-modification-count"}
#: The planted bug that breaks neither: a put that keeps a reference to the
#: state it replaced. The map's structure is exactly the real map's (a state's
#: reference count is no part of it, so neither checker can see it) and every
#: result is right; only the state's lifetime is wrong, which the machine's and
#: the runner's lifetime checks see (cowstate_spec.collected).
LIFETIME_ONLY = {"c-put-leaks-replaced-state"}
#: Workloads of the smoke preset each bug must be caught within (the first is enough
#: for all but one today).
WORKLOADS = 6


@functools.cache
def examples_to_catch(bug: CBug | CRewrite) -> int:
    """How many examples of the hunt the state machine starts until it catches
    ``bug`` (``cowstate_spec.profiles.hunt``; it fails if the hunt passes).
    Once per bug and process: the catch test and the control share it."""
    return hunt(machine_for(bad_cmap_implementation(bug)), HUNT, (AssertionError,))


@pytest.mark.parametrize("bug", [*PLANTED, *C_TRACKING_REWRITES], ids=lambda bug: bug.name)
def test_state_machine_catches(bug: CBug | CRewrite) -> None:
    assert 0 < examples_to_catch(bug) <= HUNT.max_examples + 1


def test_the_real_c_map_passes_the_same_hunt() -> None:
    """Control: the real C map passes the hunt that catches every planted bug.
    Under COWSTATE_STRENGTH=reduced (make test) as far as the longest of the
    hunts went (derandomized, the control meets the same first examples), the
    whole budget under full (make strength)."""
    longest = max(examples_to_catch(bug) for bug in PLANTED)
    examples = control_examples(longest, HUNT.max_examples)
    run_state_machine_as_test(
        machine_for(by_name("c-map")), settings=settings(HUNT, max_examples=examples)
    )


def runner_divergence(implementation: Implementation) -> str | None:
    """The first divergence the differential runner reports on the first smoke
    workloads (it stops there: a map that freed what a snapshot reaches may
    crash when read on), or None. Workload ``index`` runs as ``cowstate
    check`` runs it (``workload=index``)."""
    spec = preset("smoke")
    for index in range(WORKLOADS):
        result = run_workload(
            implementation,
            operations(spec, index),
            workload=index,
            check_every=spec.check_every,
            initial_capacity=spec.initial_capacity,
        )
        if result.diverged:
            return f"workload {index} at {result.divergence_at}: {result.actual}"
    return None


#: The allocator of the process the runner meets the planted bugs in: glibc's
#: malloc for Python's objects too, every block filled with the byte 165 as it
#: is freed (MALLOC_PERTURB_). A read through a pointer to freed memory then
#: meets that byte, not whatever object happened to lie there, and crashes
#: the process at once. In a test process's own allocator such a read crashed
#: one CI run in hundreds (stop 37: planted bugs 5 and 7 read what their maps
#: had freed; "Structure first" in cowstate_spec.differential and the trim to
#: 0 of rule P now name them before anything is freed).
POISONED_FREES = {"PYTHONMALLOC": "malloc", "MALLOC_PERTURB_": "165"}

_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_spec_catches_bad_cmaps import PLANTED, runner_divergence
from cowstate_spec.bad_cmaps import bad_cmap_implementation
for bug in PLANTED:
    if bug.name in sys.argv[2:]:
        divergence = runner_divergence(bad_cmap_implementation(bug))
        print(json.dumps([bug.name, divergence]), flush=True)
"""


@functools.cache
def runner_divergences_freed_memory_poisoned() -> dict[str, str | None]:
    """``runner_divergence`` of every planted bug, run in a child process whose
    frees are poisoned (POISONED_FREES), by bug name. A bug whose run crashed the
    child maps to ``crashed by signal N``, one that ran past CHILD_SECONDS (a
    chain that freed memory made a cycle) to ``crashed: hung``; the runs after
    it go on in a new child."""
    found: dict[str, str | None] = {}
    left = [bug.name for bug in PLANTED]
    while left:
        command = [sys.executable, "-c", _CHILD, str(Path(__file__).parent), *left]
        env = {**os.environ, **POISONED_FREES}
        try:
            done = subprocess.run(
                command,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=CHILD_SECONDS,
            )
            out, returncode, err = done.stdout, done.returncode, done.stderr
        except subprocess.TimeoutExpired as exc:
            out, returncode, err = _text(exc.stdout), None, _text(exc.stderr)
        for line in out.splitlines():
            name, divergence = json.loads(line)
            found[name] = divergence
        left = [name for name in left if name not in found]
        if returncode == 0:
            assert not left, f"the child reported no run of {left}: {err[-2000:]}"
            break
        if (returncode is not None and returncode > 0) or not left:
            raise RuntimeError(f"the child failed ({returncode}): {err[-2000:]}")
        found[left.pop(0)] = (
            "crashed: hung"
            if returncode is None
            else f"crashed by signal {signal.Signals(-returncode).name}"
        )
    return found


#: How long the child may take over the bugs left (about 6 s for all of them
#: on a quiet machine; make test's load triples that at most).
CHILD_SECONDS = 240


def _text(output: bytes | str | None) -> str:
    """What a timed-out child printed (bytes, even with text=True)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


@pytest.mark.parametrize("bug", PLANTED, ids=lambda bug: bug.name)
def test_the_differential_runner_catches_each_bug_before_it_reads_freed_memory(
    bug: CBug | CRewrite,
) -> None:
    """The runner reports each planted bug as a divergence within WORKLOADS
    smoke workloads, and before it reads memory the bug's map freed: its run
    in a process that poisons what is freed reports it and does not crash."""
    implementation = bad_cmap_implementation(bug)
    snapshot = implementation.create().snapshot()
    assert PROBE is not None and implementation.fingerprint is not None
    assert isinstance(implementation.fingerprint(snapshot), PROBE.Fingerprint)  # the C checker
    divergence = runner_divergences_freed_memory_poisoned()[bug.name]
    assert divergence is not None
    assert not divergence.startswith("crashed"), divergence
    if bug.name in LIFETIME_ONLY:
        assert "a leaked reference: state " in divergence
        assert "and replaced by put at step " in divergence, divergence


@pytest.mark.parametrize(
    "control",
    ["c-map", *(c_identity(bug) for bug in C_REWRITES)],
    ids=lambda control: getattr(control, "name", control),
)
def test_the_real_c_map_passes_the_same_workloads(control: str | CRewrite) -> None:
    implementation = (
        by_name(control) if isinstance(control, str) else bad_cmap_implementation(control)
    )
    assert runner_divergence(implementation) is None


def outcome(check: Callable[[], Any]) -> tuple[Any, str | None]:
    """What ``check()`` returned, or the message of the AssertionError it raised."""
    try:
        return check(), None
    except AssertionError as exc:
        return None, str(exc)


def apply(m: Any, op: tuple[Any, ...], open_: list[tuple[Any, Any, Any]]) -> None:
    """One workload operation other than a snapshot (the runner's meaning)."""
    name, args = op[0], op[1:]
    try:
        if name == "release":
            if open_:
                open_.pop(args[0] % len(open_))[0].release()
        elif name in ("put", "put_and_get_old"):
            getattr(m, name)(args[0], args[1], deep_copy(args[2]))
        elif name == "get_and_mutate":
            mutate_in_place(m.get(args[0], args[1]), args[2])
        elif name == "transform":
            m.transform(args[0], args[1], args[2], TRANSFORMS[args[3]])
        elif name in ("get", "contains_key", "remove", "remove_and_get_old"):
            getattr(m, name)(args[0], args[1])
    except Exception as exc:  # a refusal of cowstate.errors leaves the map unchanged
        if not type(exc).__module__.startswith("cowstate"):
            raise


def first_verdicts(implementation: Implementation, limit: int) -> tuple[str | None, str | None]:
    """Replay the first smoke workload, checking after every operation with the
    probe's checker and with the reference; their first messages (None: passed)."""
    spec = preset("smoke")
    m = implementation.create(spec.initial_capacity)
    open_: list[tuple[Any, Any, Any]] = []  # (snapshot, the probe's fp, the reference's)
    try:
        for op in operations(spec, 0)[:limit]:
            if op[0] == "snapshot":
                s = m.snapshot()
                by_probe, probe_says = outcome(partial(fingerprint, s))
                by_reference, reference_says = outcome(partial(fingerprint, s, reference=True))
                open_.append((s, by_probe, by_reference))
            else:
                apply(m, op, open_)
                _, probe_says = outcome(lambda: check_map(m, [fp for _, fp, _ in open_]))
                _, reference_says = outcome(
                    lambda: check_map(m, [fp for _, _, fp in open_], reference=True)
                )
            if probe_says is not None or reference_says is not None:
                return probe_says, reference_says
        return None, None
    finally:
        for s, _, _ in open_:
            if not s.is_released:
                s.release()


@pytest.mark.parametrize("bug", [*PLANTED, None], ids=lambda bug: getattr(bug, "name", "c-map"))
def test_both_checkers_name_the_same_first_violation(bug: CBug | CRewrite | None) -> None:
    implementation = by_name("c-map") if bug is None else bad_cmap_implementation(bug)
    by_probe, by_reference = first_verdicts(implementation, limit=600)
    assert by_probe == by_reference
    if bug is None or bug.name in BEHAVIOUR_ONLY | LIFETIME_ONLY:
        assert by_probe is None
    else:
        assert by_probe is not None and by_probe.startswith("invariant ")


def test_a_rewrite_changed_in_place_is_built_and_loaded_again() -> None:
    # The build cache was keyed by the rewrite's name and the map's source
    # alone: a rewrite whose text changed under the same name loaded the old
    # build (c-scalar-exemption-takes-lists kept testing its first text).
    bug = next(b for b in C_REWRITES if b.name == "c-scalar-exemption-takes-lists")
    same_name = CRewrite(bug.name, bug.old, bug.old, "the same name, another text")
    planted, unchanged = build_bad_cmap(bug), build_bad_cmap(same_name)
    assert planted.__file__ != unchanged.__file__
    for module, shares in ((planted, True), (unchanged, False)):
        m = module.CopyOnWriteStateMap()
        m.put(1, 0, [1])
        snapshot = m.snapshot()
        m.get(1, 0).append(2)
        assert (snapshot.items()[0][2] == [1, 2]) is shares
        snapshot.release()
