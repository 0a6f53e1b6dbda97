"""The symbolic checks are strong enough to fail: CrossHair refutes every
one-line bug of ``cowstate_spec.bad_arithmetic`` in a copy of
``cowstate/arithmetic.py`` and tells a broken snapshot layout from the plain
one. (The real module's checks run in ``make test`` as
``python -m cowstate_spec.symbolic``; this test proves they can fail.)

CrossHair spends its whole limit on every condition it cannot refute (a
check job runs a function's other conditions to their timeout, a
diffbehavior job its limit), so a job costs its limits, not the refutation.
The limits are CPU seconds. Under ``COWSTATE_STRENGTH=reduced`` (``make
test``) they are :data:`REDUCED`: measured on this 2-core machine, each
planted bug is refuted within half of them (check, key groups: 0.5 s) and
three fifths (the layout: 3 s); ``make strength`` uses :data:`FULL`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cowstate.key_groups
from cowstate_spec.bad_arithmetic import BUGS, KEY_GROUP_BUGS, broken_source
from cowstate_spec.profiles import strength
from cowstate_spec.symbolic import PROFILES, Job, Limits, jobs_for, run_jobs

#: CPU seconds per condition: (check, the layout's diffbehavior, key groups' diffbehavior).
FULL = (10.0, 30.0, 5.0)
REDUCED = (1.0, 5.0, 1.0)
CHECK, LAYOUT, KEY_GROUPS = FULL if strength() == "full" else REDUCED
LIMITS = Limits(per_condition=CHECK, per_path=2, deadline=300)


def test_crosshair_check_refutes_every_broken_helper(tmp_path: Path) -> None:
    jobs = []
    for bug in BUGS:
        source = broken_source(bug)
        module = tmp_path / f"broken_{bug.function}.py"
        module.write_text(source)
        lines = source.splitlines()
        line = lines.index(next(text for text in lines if text.startswith(f"def {bug.function}(")))
        jobs += jobs_for(LIMITS, [f"{module}:{line + 2}"], [])  # a line of its body
    run_jobs(jobs, LIMITS.deadline, workers=2)
    missed = [
        (bug, job.output)
        for bug, job in zip(BUGS, jobs, strict=True)
        if job.passed or not any(": error:" in line for line in job.findings)
    ]
    assert not missed, f"CrossHair found no counterexample for: {missed}"


def test_crosshair_diffbehavior_tells_a_broken_layout_from_the_plain_one() -> None:
    limits = Limits(per_condition=LAYOUT, per_path=2, deadline=300)
    pair = (
        "snapshot_layout",
        "cowstate_spec.bad_arithmetic.bad_snapshot_layout",
        "cowstate_spec.equivalences.plain_snapshot_layout",
    )
    [job] = jobs_for(limits, [], [pair])
    run_jobs([job], limits.deadline, workers=1)
    assert not job.passed and "No differences found" not in job.output, job.output


def test_crosshair_diffbehavior_tells_a_broken_key_group_helper_from_the_plain_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = Limits(per_condition=KEY_GROUPS, per_path=2, deadline=300)
    jobs = []
    for i, bug in enumerate(KEY_GROUP_BUGS):
        module = f"broken_key_groups_{i}"
        (tmp_path / f"{module}.py").write_text(broken_source(bug, cowstate.key_groups))
        # Unguarded on both sides: the two functions agree on every int, not only int32.
        jobs += jobs_for(
            limits,
            [],
            [
                (
                    bug.function,
                    f"{module}.{bug.function}",
                    f"cowstate_model.key_groups.{bug.function}",
                )
            ],
        )
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    run_jobs(jobs, limits.deadline, workers=2)
    missed = [
        (bug, job.output)
        for bug, job in zip(KEY_GROUP_BUGS, jobs, strict=True)
        if job.passed
        or "No differences found" in job.output
        or not any(line.startswith("Given:") for line in job.findings)
    ]
    assert not missed, f"CrossHair told no difference for: {missed}"


def test_a_passing_job_needs_exit_status_zero_and_no_finding() -> None:
    assert Job("x", [], returncode=0).passed
    assert not Job("x", [], returncode=1).passed
    assert not Job("x", [], returncode=0, findings=["m.py:3: error: false"]).passed


def test_the_quick_profile_gives_the_layouts_pair_longer_and_every_other_job_the_same() -> None:
    """``make crosshair``'s limits: 1 CPU s per condition (each planted check
    bug is refuted within 0.5 s), 3 for the snapshot layout's pair."""
    quick = PROFILES["quick"]
    pairs = [("spread_hash", "a.f", "b.f"), ("snapshot_layout", "a.g", "b.g"), ("x", "a.h", "b.h")]
    jobs = jobs_for(quick, ["m.f", "m.g"], pairs)

    def limit(job: Job) -> float:
        return float(job.argv[job.argv.index("--per_condition_timeout") + 1])

    assert [(job.name, limit(job)) for job in jobs] == [
        ("check m.f", 1.0),
        ("check m.g", 1.0),
        ("diffbehavior spread_hash", 1.0),
        ("diffbehavior snapshot_layout", 3.0),
        ("diffbehavior x", 1.0),
    ]
    assert REDUCED[0] <= quick.per_condition  # the limit the planted bugs are refuted within
