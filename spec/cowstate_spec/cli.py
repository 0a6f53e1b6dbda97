"""The ``cowstate`` command.

``cowstate check`` runs random workloads against every chosen implementation
and the reference model, in this process, and prints a report; the exit code
is 1 when any workload diverged.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence

from cowstate_spec.differential import WorkloadResult, generate, run_workload
from cowstate_spec.implementations import IMPLEMENTATIONS, by_name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cowstate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="differential run: implementations vs the model")
    check.add_argument("--workloads", type=int, default=50, help="number of workloads")
    check.add_argument("--ops", type=int, default=2000, help="operations per workload")
    check.add_argument("--seed", type=int, default=0, help="base seed; workload i uses seed+i")
    check.add_argument("--implementation", action="append", dest="implementations",
                       help="implementation name (repeatable; default: all but the model)")
    args = parser.parse_args(argv)
    if args.workloads < 1 or args.ops < 1:
        parser.error(f"expected --workloads and --ops >= 1, got {args.workloads}, {args.ops}")
    try:
        chosen = ([by_name(n) for n in args.implementations] if args.implementations else
                  [i for i in IMPLEMENTATIONS if i.name != "reference-model"])
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    return check_command(chosen, args.workloads, args.ops, args.seed)


def check_command(implementations: Sequence[object], workloads: int, ops: int,
                  seed: int) -> int:
    from cowstate_spec.implementations import Implementation

    started = time.perf_counter()
    results: list[WorkloadResult] = []
    total = workloads * len(implementations)
    for index in range(workloads):
        operations = generate(seed + index, ops)
        for implementation in implementations:
            assert isinstance(implementation, Implementation)
            results.append(run_workload(implementation, operations, seed + index))
        done = len(results)
        if sys.stdout.isatty():
            print(f"\r  {done}/{total} workloads checked", end="", flush=True)
        elif done == total or done % max(1, total // 10) == 0:
            print(f"  {done}/{total} workloads checked", flush=True)
    if sys.stdout.isatty():
        print()
    elapsed = time.perf_counter() - started
    return report(results, elapsed)


def report(results: list[WorkloadResult], elapsed: float) -> int:
    checked = sum(r.applied for r in results)
    counts: Counter[str] = Counter()
    for r in results:
        counts.update(r.operation_counts)
    diverged = [r for r in results if r.diverged]
    print("cowstate differential run (in-process)")
    print(f"  implementations   : {', '.join(sorted({r.implementation for r in results}))}")
    print(f"  workloads         : {len(results)}")
    print(f"  operations checked: {checked:,}")
    print(f"  elapsed           : {elapsed:.1f} s on 1 of {os.cpu_count()} cores")
    print(f"  ops per second    : {checked / elapsed:,.0f}")
    print("  operation counts  : " + ", ".join(f"{k}={v:,}" for k, v in counts.most_common()))
    print(f"  divergences       : {len(diverged)}")
    for r in diverged[:10]:
        print(f"    - {r.implementation} seed {r.seed} at op {r.divergence_at} "
              f"{r.divergence_operation!r}: expected {r.expected}, got {r.actual}")
    return 1 if diverged else 0


if __name__ == "__main__":
    raise SystemExit(main())
