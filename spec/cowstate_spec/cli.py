"""The ``cowstate`` command.

``cowstate check`` runs the workloads of a spec (``--spec FILE`` or
``--preset NAME``) against every implementation it names and the reference
model -- on Spark (``--master``, default ``local[*]``) or ``in-process`` --
writes ``records.parquet``, ``summary.json`` and minimized traces into
``--out``, prints a short summary, and exits 1 when anything diverged.

``cowstate savepoint inspect DIR`` is :mod:`cowstate.cli`'s (the console
script's entry point, which hands ``check`` to this module); it is accepted
here too.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cowstate_spec.workloads import PRESETS, WorkloadSpec, preset


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cowstate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="differential run: implementations vs the model")
    source = check.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", type=Path, help="workload spec file (.json, .yaml)")
    source.add_argument("--preset", choices=sorted(PRESETS), help="a shipped workload spec")
    check.add_argument("--workloads", type=int, help="override the number of workloads")
    check.add_argument("--ops", type=int, help="override the operations per workload")
    check.add_argument("--seed", type=int, help="override the base seed")
    check.add_argument(
        "--implementation",
        action="append",
        dest="implementations",
        help="implementation to check (repeatable; overrides the spec's)",
    )
    check.add_argument(
        "--master", default="local[*]", help="Spark master URL, or 'in-process' (default: local[*])"
    )
    check.add_argument("--partitions", type=int, help="Spark partitions (default: 4 per core)")
    check.add_argument(
        "--out", type=Path, default=Path("out/check"), help="output directory (default: out/check)"
    )
    check.add_argument(
        "--regressions-dir",
        type=Path,
        help="where minimized pytest regressions go "
        "(default: tests/regressions if it exists, else OUT/regressions)",
    )
    check.add_argument("--no-progress", action="store_true", help="no progress bar")
    savepoint = commands.add_parser("savepoint", help="checkpoints and savepoints")
    savepoint_commands = savepoint.add_subparsers(dest="savepoint_command", required=True)
    inspect = savepoint_commands.add_parser(
        "inspect", help="print what a checkpoint or savepoint directory holds"
    )
    inspect.add_argument("directory", help="a chk-<id> or savepoint directory (path or URL)")
    args = parser.parse_args(argv)
    if args.command == "savepoint":
        from cowstate.cli import inspect_command

        return inspect_command(args.directory)
    try:
        spec = _spec(args)
    except (ValidationError, OSError, ValueError) as exc:
        parser.error(str(exc))
    from cowstate_spec.spark_job import run_check

    regressions = args.regressions_dir or (
        Path("tests/regressions")
        if Path("tests/regressions").is_dir()
        else args.out / "regressions"
    )
    report = run_check(
        spec,
        args.out,
        master=args.master,
        partitions=args.partitions,
        regressions_dir=regressions,
        progress=not args.no_progress,
    )
    print_summary(report.summary, args.out)
    return 1 if report.divergences else 0


def _spec(args: argparse.Namespace) -> WorkloadSpec:
    spec = WorkloadSpec.load(args.spec) if args.spec else preset(args.preset)
    overrides: dict[str, Any] = {}
    if args.workloads is not None:
        overrides["workloads"] = args.workloads
    if args.ops is not None:
        overrides["operations_per_workload"] = args.ops
    if args.seed is not None:
        overrides["base_seed"] = args.seed
    if args.implementations:
        overrides["implementations"] = args.implementations
    return WorkloadSpec.model_validate({**spec.model_dump(), **overrides})


def print_summary(summary: dict[str, Any], out: Path) -> None:
    divergences = summary["divergences"]
    print(
        f"cowstate check: spec {summary['spec']} on {summary['master']} ({summary['cores']} cores)"
    )
    print(f"  implementations    : {', '.join(summary['implementations'])}")
    print(f"  workloads          : {summary['workloads']:,}")
    print(
        f"  operations checked : {summary['operations_checked']:,} "
        f"in {summary['elapsed_seconds']:.1f} s"
    )
    print(
        f"  ops/s              : {summary['ops_per_second']:,.0f} "
        f"({summary['ops_per_second_per_core']:,.0f} per core)"
    )
    mix = ", ".join(f"{k} {v:,}" for k, v in list(summary["operation_counts"].items())[:6])
    print(f"  most frequent ops  : {mix}")
    print(f"  divergences        : {len(divergences)}")
    for d in divergences[:10]:
        print(
            f"    - {d['implementation']} workload {d['workload']} at op "
            f"{d['divergence_at']} {d['operation']}: minimized to "
            f"{d['minimized_operations']} ops -> {d['trace']}"
        )
        print(f"      expected {d['expected']}, got {json.dumps(d['actual'][-300:])}")
    print(
        f"  output             : {out}/summary.json, records.parquet"
        f"{', traces/' if divergences else ''}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
