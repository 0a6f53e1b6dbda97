"""Benchmark of the differential run: checked operations per second per core.

Method
------
1. Per implementation, in this process, without Spark: run the first
   ``--workloads`` workloads of the ``smoke`` preset through
   ``run_workload`` (one warm-up workload first, discarded) and divide the
   operations checked by the CPU time (``time.process_time``). This is the
   throughput of one core, the number the target is about.
2. On Spark: ``cowstate check --preset smoke`` as a subprocess with
   ``--master local[1]`` and then ``local[2]`` (a SparkSession's master cannot
   change inside one process), the same workloads each time, repeated
   ``--repeats`` times; each run's ``elapsed_seconds`` (the Spark job alone,
   after the session started and one warmed-up Python worker per core
   imported the checker) is read from its ``summary.json``. The median
   is reported, and the speed-up is median(local[1]) / median(local[2]).

Targets: at least 100,000 checked operations per second per core on the
smoke preset; at least 1.7x from one core to two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cowstate_spec.differential import run_workload
from cowstate_spec.implementations import by_name
from cowstate_spec.workloads import operations, preset

PER_CORE_TARGET = 100_000
SPEEDUP_TARGET = 1.7


def in_process(names: list[str], workloads: int) -> dict[str, float]:
    spec = preset("smoke")
    out: dict[str, float] = {}
    for name in names:
        implementation = by_name(name)
        run_workload(
            implementation,
            operations(spec, workloads),
            check_every=spec.check_every,
            initial_capacity=spec.initial_capacity,
        )
        checked = 0
        started = time.process_time()
        for index in range(workloads):
            result = run_workload(
                implementation,
                operations(spec, index),
                check_every=spec.check_every,
                initial_capacity=spec.initial_capacity,
            )
            checked += result.applied
        out[name] = checked / (time.process_time() - started)
    return out


def on_spark(master: str, workloads: int, repeats: int) -> list[dict[str, float]]:
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "cowstate_spec.cli",
                    "check",
                    "--preset",
                    "smoke",
                    "--workloads",
                    str(workloads),
                    "--master",
                    master,
                    "--out",
                    out,
                    "--no-progress",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            runs.append(json.loads((Path(out) / "summary.json").read_text()))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", type=int, default=40, help="in-process workloads")
    parser.add_argument("--spark-workloads", type=int, default=1200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()

    print("Differential run throughput (preset smoke)")
    per_core = in_process(["cow-map", "cow-map-128", "reference-model"], args.workloads)
    print(f"\n  {'implementation':<18} {'checked ops/s on one core':>26}")
    for name, rate in per_core.items():
        print(f"  {name:<18} {rate:>26,.0f}")
    results: dict[str, object] = {"in_process_ops_per_core_second": per_core}
    targets = [
        (
            "checked ops/s per core (cow-map) >= 100,000",
            per_core["cow-map"],
            per_core["cow-map"] >= PER_CORE_TARGET,
        )
    ]
    if not args.no_spark:
        one = on_spark("local[1]", args.spark_workloads, args.repeats)
        two = on_spark("local[2]", args.spark_workloads, args.repeats)
        t1 = statistics.median(r["elapsed_seconds"] for r in one)
        t2 = statistics.median(r["elapsed_seconds"] for r in two)
        ops = one[0]["operations_checked"]
        print(
            f"\n  Spark, {args.spark_workloads} workloads, {ops:,} checked operations, "
            f"median of {args.repeats}:"
        )
        print(f"  local[1]: {t1:7.2f} s  {ops / t1:>10,.0f} ops/s  {ops / t1:>10,.0f} per core")
        print(f"  local[2]: {t2:7.2f} s  {ops / t2:>10,.0f} ops/s  {ops / t2 / 2:>10,.0f} per core")
        speedup = t1 / t2
        print(f"  speed-up local[1] -> local[2]: {speedup:.2f}x")
        results.update(
            {
                "spark_local1_seconds": t1,
                "spark_local2_seconds": t2,
                "spark_operations": ops,
                "speedup": speedup,
            }
        )
        targets.append(
            ("speed-up local[1] -> local[2] >= 1.7x", speedup, speedup >= SPEEDUP_TARGET)
        )
    print("\n  Targets")
    for name, value, met in targets:
        print(f"  {'MET    ' if met else 'NOT MET'}  {name}  (measured {value:,.2f})")
    Path("bench/results").mkdir(parents=True, exist_ok=True)
    Path("bench/results/differential.json").write_text(
        json.dumps(
            {**results, "targets": [{"name": n, "value": v, "met": m} for n, v, m in targets]},
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
