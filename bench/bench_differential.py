"""Benchmark of the differential run: checked operations per second per core.

Method
------
1. **One core, in this process.** Per implementation, the first
   ``--workloads`` workloads of the ``smoke`` preset through
   ``run_workload`` (one warm-up workload first, discarded), divided by the
   CPU time of this thread (``time.thread_time``): the checker's own speed,
   which other processes on the machine barely move.
2. **Where the time goes.** cProfile of one partition's work (``run_index``
   over ``--profile-workloads`` workloads, both default implementations, as
   an executor runs it) and the Arrow conversion of its records, grouped:
   generating the operations, applying them to the implementation and the
   model, the model's snapshot copies, snapshot fingerprints, comparing
   snapshots at their release, the structural checks every ``check_every``
   operations, and building the Arrow batch.
3. **On Spark.** ``cowstate check --preset smoke --workloads N`` as a
   subprocess (a SparkSession's master cannot change inside one process),
   alternating ``--master local[1]`` and ``local[2]``, ``--repeats`` times
   each. From each ``summary.json``: ``elapsed_seconds`` (the Spark job
   alone, after the session started and a warmed-up Python worker per core
   imported the checker) and ``cpu_seconds`` (the CPU the checking threads
   got). Reported: the medians, checked ops/s per core (wall clock), checked
   ops per CPU second, and the **CPU share** -- ``cpu_seconds / (elapsed x
   cores)``, the part of its cores the job really had. A share well below 1
   means other processes used the cores: the wall-clock rates and the
   speed-up then measure the neighbours, not the checker. The load average
   before and after is printed too.

Targets: at least 100,000 checked operations per second per core on the
smoke preset on ``local[2]`` (wall clock); at least 1.8x from ``local[1]``
to ``local[2]`` (median elapsed over median elapsed).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cowstate_spec.differential import run_workload
from cowstate_spec.implementations import by_name
from cowstate_spec.spark_job import record_arrow_schema, run_index
from cowstate_spec.workloads import operations, preset

PER_CORE_TARGET = 100_000
SPEEDUP_TARGET = 1.8

#: Profile groups: (label, callee (file suffix, function), caller or None): the
#: cumulative time of the callee, only where that caller called it if given.
GROUPS: list[tuple[str, tuple[str, str], tuple[str, str] | None]] = [
    ("generating the operations", ("cowstate_spec/workloads.py", "operations"), None),
    (
        "the model's snapshot (deep copy)",
        ("cowstate_model/state_map.py", "snapshot"),
        ("cowstate_spec/differential.py", "apply"),
    ),
    (
        "fingerprints of new snapshots",
        ("cowstate_spec/invariants.py", "fingerprint"),
        ("cowstate_spec/differential.py", "apply"),
    ),
    (
        "comparing each snapshot at its release",
        ("cowstate_spec/differential.py", "compare_snapshot"),
        ("cowstate_spec/differential.py", "apply"),
    ),
    (
        "structure + open snapshots every check_every",
        ("cowstate_spec/differential.py", "check_all"),
        None,
    ),
    ("Arrow batch of the records", ("~", "<method 'from_pylist'"), None),
]


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
        cpu = 0.0
        for index in range(workloads):
            ops = operations(spec, index)
            started = time.thread_time()
            result = run_workload(
                implementation,
                ops,
                check_every=spec.check_every,
                initial_capacity=spec.initial_capacity,
            )
            cpu += time.thread_time() - started
            checked += result.applied
        out[name] = checked / cpu
    return out


def profile(workloads: int) -> list[tuple[str, float]]:
    """Shares of one partition's time (run_index and the Arrow batches), grouped."""
    import pyarrow as pa

    spec = preset("smoke")
    run_index(spec, workloads)  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    for start in range(0, workloads, 8):
        records = [
            r for index in range(start, min(start + 8, workloads)) for r in run_index(spec, index)
        ]
        pa.RecordBatch.from_pylist(records, schema=record_arrow_schema())
    profiler.disable()
    entries: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(tottime for _, _, tottime, _, _ in entries.values())

    def matches(function: Any, pattern: tuple[str, str]) -> bool:
        filename, _, name = function
        return bool(filename.endswith(pattern[0]) and name.startswith(pattern[1]))

    shares = []
    for label, callee, caller in GROUPS:
        cumulative = 0.0
        for function, (_, _, _, cumtime, callers) in entries.items():
            if not matches(function, callee):
                continue
            if caller is None:
                cumulative += cumtime
            else:
                cumulative += sum(
                    edge[3] for source, edge in callers.items() if matches(source, caller)
                )
        shares.append((label, cumulative / total))
    shares.append(
        ("applying and comparing the operations (the rest)", 1 - sum(s for _, s in shares))
    )
    return shares


def on_spark(workloads: int, repeats: int) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"local[1]": [], "local[2]": []}
    for _ in range(repeats):
        for master in runs:
            with tempfile.TemporaryDirectory() as out:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "cowstate",
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
                runs[master].append(json.loads((Path(out) / "summary.json").read_text()))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", type=int, default=40, help="in-process workloads")
    parser.add_argument("--profile-workloads", type=int, default=16)
    parser.add_argument("--spark-workloads", type=int, default=1200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()

    load_before = os.getloadavg()
    print(f"Differential run throughput (preset smoke), load average {load_before[0]:.2f}")
    names = [*preset("smoke").implementations, "cow-map-128", "reference-model"]
    per_core = in_process(names, args.workloads)
    print(f"\n  {'implementation':<18} {'checked ops per CPU second (one core)':>38}")
    for name, rate in per_core.items():
        print(f"  {name:<18} {rate:>38,.0f}")
    shares = profile(args.profile_workloads)
    print(f"\n  Where one partition's time goes ({args.profile_workloads} workloads, cProfile):")
    for label, share in shares:
        print(f"  {label:<46} {share:>6.1%}")
    results: dict[str, Any] = {
        "in_process_ops_per_cpu_second": per_core,
        "profile_shares": dict(shares),
        "load_average_before": load_before,
    }
    targets: list[tuple[str, float, bool]] = []
    if not args.no_spark:
        runs = on_spark(args.spark_workloads, args.repeats)
        ops = runs["local[1]"][0]["operations_checked"]
        print(
            f"\n  Spark, {args.spark_workloads} workloads, {ops:,} checked operations, "
            f"median of {args.repeats}, local[1] and local[2] alternating:"
        )
        print(
            f"  {'master':<9} {'elapsed':>9} {'ops/s':>10} {'per core':>10} "
            f"{'per CPU s':>10} {'CPU share':>10}"
        )
        medians = {}
        for master, cores in (("local[1]", 1), ("local[2]", 2)):
            elapsed = statistics.median(r["elapsed_seconds"] for r in runs[master])
            cpu = statistics.median(r["cpu_seconds"] for r in runs[master])
            medians[master] = elapsed
            print(
                f"  {master:<9} {elapsed:>8.2f}s {ops / elapsed:>10,.0f} "
                f"{ops / elapsed / cores:>10,.0f} {ops / cpu:>10,.0f} "
                f"{cpu / elapsed / cores:>10.0%}"
            )
            results[f"spark_{master}"] = runs[master]
        speedup = medians["local[1]"] / medians["local[2]"]
        per_core_two = ops / medians["local[2]"] / 2
        load_after = os.getloadavg()
        print(f"  speed-up local[1] -> local[2]: {speedup:.2f}x")
        print(f"  load average after: {load_after[0]:.2f} (2 cores: above 2, others shared them)")
        results.update({"speedup": speedup, "load_average_after": load_after})
        targets += [
            (
                "checked ops/s per core on local[2] >= 100,000",
                per_core_two,
                per_core_two >= PER_CORE_TARGET,
            ),
            ("speed-up local[1] -> local[2] >= 1.8x", speedup, speedup >= SPEEDUP_TARGET),
        ]
    smoke = preset("smoke").implementations  # a run checks these, one after the other
    combined = len(smoke) / sum(1 / per_core[name] for name in smoke)
    print(f"\n  smoke's implementations together: {combined:,.0f} checked ops per CPU second")
    results["in_process_smoke_ops_per_cpu_second"] = combined
    targets.append(
        (
            "checked ops per CPU second in process (smoke) >= 100,000",
            combined,
            combined >= PER_CORE_TARGET,
        )
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
