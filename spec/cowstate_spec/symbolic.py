"""Symbolic checks with CrossHair: ``python -m cowstate_spec.symbolic``.

Two kinds of job, run in parallel, each with a bounded CPU time per
condition and the whole run with a wall-clock deadline:

- ``crosshair check`` over the PEP 316 contracts of :data:`CHECKED_MODULES`
  (``pre:``/``post:`` in the docstrings): CrossHair searches symbolically for
  an input that meets the preconditions and breaks a postcondition;
- ``crosshair diffbehavior`` over every pair of
  :data:`cowstate_spec.equivalences.PAIRS`: an optimized helper and its plain
  statement in the model must agree on every input of the map's domain.

``--profile quick`` (``make test``: 1 CPU second per condition, twice what
CrossHair needs to refute each planted bug of ``cowstate_spec.bad_arithmetic``
and the limit ``tests/test_symbolic.py`` refutes them within; 3 for the
snapshot layout's pair, whose planted bug needs 3 of the 5 that test gives it) and
``--profile deep`` (``make verify``: minutes per condition) differ only in
those limits. No counterexample is the only passing result: any
``error:`` line, a difference, a crash of CrossHair or the deadline fails the
run (exit status 1). The table printed at the end names every condition
checked, whether CrossHair confirmed it over all paths or found no
counterexample within its limit, and the time each job took.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cowstate_spec.equivalences import PAIRS

__all__ = ["CHECKED_MODULES", "PROFILES", "Job", "main", "run_jobs"]

#: Modules whose docstring contracts ``crosshair check`` verifies.
CHECKED_MODULES = ["cowstate.arithmetic", "cowstate.key_groups"]


@dataclass(frozen=True)
class Limits:
    per_condition: float  # CPU seconds CrossHair spends on one condition
    per_path: float  # CPU seconds on one execution path
    deadline: float  # wall-clock seconds for the whole run
    #: per_condition of the named diffbehavior pairs that need longer
    longer: Mapping[str, float] = field(default_factory=dict)


PROFILES = {
    "quick": Limits(per_condition=1, per_path=1, deadline=600, longer={"snapshot_layout": 3}),
    "deep": Limits(per_condition=60, per_path=10, deadline=2 * 3600),
}


@dataclass
class Job:
    """One CrossHair invocation and what it reported."""

    name: str
    argv: list[str]
    seconds: float = 0.0
    returncode: int | None = None
    output: str = ""
    findings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.findings

    @property
    def conditions(self) -> tuple[int, int]:
        """(proved over all paths, no counterexample within the limits), from
        ``crosshair check --report_all``."""
        return (self.output.count("Confirmed over all paths"), self.output.count("Not confirmed"))


def contract_targets(module_name: str) -> tuple[str, ...]:
    """The functions of ``module_name`` that carry a PEP 316 postcondition: the
    targets of one CrossHair job (a job per function started CrossHair 15
    times, about a CPU second each, for the same conditions)."""
    module = importlib.import_module(module_name)
    return tuple(
        f"{module_name}.{name}"
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if fn.__module__ == module_name and "post:" in (fn.__doc__ or "")
    )


def jobs_for(
    limits: Limits, targets: Sequence[str | tuple[str, ...]], pairs: list[tuple[str, str, str]]
) -> list[Job]:
    """One ``crosshair check`` job per target (a function, module or file:line,
    or a tuple of them: one job over all) and one ``crosshair diffbehavior``
    job per pair."""
    crosshair = str(Path(sys.executable).with_name("crosshair"))

    def timeouts(per_condition: float) -> list[str]:
        return [
            "--per_condition_timeout",
            str(per_condition),
            "--per_path_timeout",
            str(limits.per_path),
        ]

    jobs = [
        Job(
            f"check {_named(target)}",
            [
                crosshair,
                "check",
                "--analysis_kind=PEP316",
                "--report_all",
                *timeouts(limits.per_condition),
                *((target,) if isinstance(target, str) else target),
            ],
        )
        for target in targets
    ]
    jobs += [
        Job(
            f"diffbehavior {name}",
            [
                crosshair,
                "diffbehavior",
                *timeouts(limits.longer.get(name, limits.per_condition)),
                fast,
                plain,
            ],
        )
        for name, fast, plain in pairs
    ]
    return jobs


def _named(target: str | tuple[str, ...]) -> str:
    """A check job's name: its target, or the module of its functions and their count."""
    if isinstance(target, str):
        return target
    modules = ", ".join(sorted({t.rsplit(".", 1)[0] for t in target}))
    return f"{modules} ({len(target)} functions)"


def run_jobs(jobs: list[Job], deadline: float, workers: int) -> None:
    """Run ``jobs`` on ``workers`` threads; a job past ``deadline`` is killed."""
    started = time.monotonic()

    def run(job: Job) -> None:
        begin = time.monotonic()
        remaining = deadline - (begin - started)
        if remaining <= 0:
            job.returncode, job.findings = -1, ["not run: the deadline had passed"]
            return
        try:
            done = subprocess.run(
                job.argv,
                capture_output=True,
                text=True,
                timeout=remaining,
                env=dict(os.environ, PYTHONHASHSEED="0"),
            )
        except subprocess.TimeoutExpired:
            job.returncode, job.findings = -1, [f"killed at the deadline of {deadline:.0f} s"]
        else:
            job.returncode = done.returncode
            job.output = done.stdout + done.stderr
            job.findings = [
                line
                for line in job.output.splitlines()
                if ": error:" in line or line.startswith("Given:") or "Traceback" in line
            ]
            if job.argv[1] == "check" and not job.findings and sum(job.conditions) == 0:
                job.findings = ["CrossHair checked no condition"]
        job.seconds = time.monotonic() - begin

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(run, jobs))


def summary(jobs: list[Job]) -> str:
    lines = [f"{'job':<58} {'result':<34} {'seconds':>8}", "-" * 102]
    for job in jobs:
        if job.name.startswith("check"):
            confirmed, unconfirmed = job.conditions
            verdict = (
                f"{confirmed + unconfirmed} conditions: {confirmed} proved, {unconfirmed} no cex"
            )
        else:
            verdict = "equal" if "No differences found" in job.output else "DIFFERENT"
        if not job.passed:
            verdict = "FAILED"
        lines.append(f"{job.name:<58} {verdict:<34} {job.seconds:8.1f}")
    for job in jobs:
        if not job.passed:
            lines.append(f"\n{job.name} (exit {job.returncode}):")
            lines += [f"  {line}" for line in (job.findings or job.output.splitlines()[-10:])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cowstate_spec.symbolic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    limits = PROFILES[args.profile]
    targets: list[str | tuple[str, ...]] = [contract_targets(m) for m in CHECKED_MODULES]
    jobs = jobs_for(limits, targets, PAIRS)
    started = time.monotonic()
    run_jobs(jobs, limits.deadline, args.workers)
    print(
        f"CrossHair, profile {args.profile}: {limits.per_condition:g} s per condition"
        + "".join(f" ({seconds:g} s for {name})" for name, seconds in limits.longer.items())
        + f", {limits.per_path:g} s per path, deadline {limits.deadline:g} s"
    )
    print(summary(jobs))
    failed = [job for job in jobs if not job.passed]
    checked = sum(sum(job.conditions) for job in jobs if job.name.startswith("check"))
    print(f"{checked} postconditions checked, {len(PAIRS)} equivalences")
    print(
        f"\n{len(jobs)} jobs in {time.monotonic() - started:.0f} s: "
        + ("no counterexample" if not failed else f"{len(failed)} FAILED")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
