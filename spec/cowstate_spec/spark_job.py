"""The differential run on Spark: ``cowstate check``'s engine.

The driver ships a spec (JSON, a few hundred bytes) and workload indices --
never operations -- to the executors with ``spark.range(n).mapInArrow(...)``,
which also works over Spark Connect, where RDDs do not exist. Each executor
regenerates its workloads from (spec, index), runs every implementation of
the spec against the model, and returns one record per (workload,
implementation). The driver collects the records as a DataFrame, writes
them as Parquet, minimizes every divergence and writes ``summary.json``.

``check_batches`` is a module-level function of the installed package, so
Spark pickles it by reference: executors import ``cowstate_spec`` from their
own environment (``PYSPARK_PYTHON`` is the driver's interpreter locally; on a
cluster, ship the package with ``--py-files`` -- see the README).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cowstate_spec.differential import minimize, run_workload, write_trace
from cowstate_spec.implementations import by_name
from cowstate_spec.workloads import WorkloadSpec, operations, workload_seed

__all__ = ["RECORD_SCHEMA", "CheckReport", "build_session", "check_batches", "run_check"]

#: The schema of one record (DDL, as mapInArrow needs it).
RECORD_SCHEMA = (
    "implementation string, workload long, seed string, operations long, applied long, "
    "elapsed double, operation_counts string, divergence_at long, "
    "divergence_operation string, expected string, actual string"
)


def check_batches(batches: Iterator[Any], spec_json: str) -> Iterator[Any]:
    """Executor side: run the workloads whose indices arrive in ``batches``."""
    import pyarrow as pa

    spec = WorkloadSpec.model_validate_json(spec_json)
    for batch in batches:
        records = [r for index in batch.column("id").to_pylist() for r in run_index(spec, index)]
        yield pa.RecordBatch.from_pylist(records, schema=_arrow_schema())


def run_index(spec: WorkloadSpec, index: int) -> list[dict[str, Any]]:
    """The records of workload ``index``: one per implementation of ``spec``."""
    ops = operations(spec, index)
    return [
        run_workload(
            by_name(name),
            ops,
            workload=index,
            seed=workload_seed(spec, index),
            check_every=spec.check_every,
            initial_capacity=spec.initial_capacity,
        ).as_record()
        for name in spec.implementations
    ]


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("implementation", pa.string()),
            ("workload", pa.int64()),
            ("seed", pa.string()),
            ("operations", pa.int64()),
            ("applied", pa.int64()),
            ("elapsed", pa.float64()),
            ("operation_counts", pa.string()),
            ("divergence_at", pa.int64()),
            ("divergence_operation", pa.string()),
            ("expected", pa.string()),
            ("actual", pa.string()),
        ]
    )


def build_session(master: str = "local[*]", app_name: str = "cowstate-check") -> Any:
    """A SparkSession with the UI off, quiet logs, and executors on this interpreter."""
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: our master
        builder = builder.master(master)
    builder = (
        builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@dataclass
class CheckReport:
    """What ``run_check`` found."""

    summary: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def divergences(self) -> list[dict[str, Any]]:
        return list(self.summary["divergences"])


def run_check(
    spec: WorkloadSpec,
    out_dir: Path,
    master: str = "local[*]",
    partitions: int | None = None,
    regressions_dir: Path | None = None,
    progress: bool = True,
) -> CheckReport:
    """Run ``spec`` and write records, summary and traces into ``out_dir``.

    ``master`` is a Spark master URL, or ``"in-process"`` to run every
    workload in this process without Spark (same outputs, one core).
    """
    import pyarrow as pa

    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if master == "in-process":
        cores = 1
        table = pa.Table.from_pylist(
            [r for index in range(spec.workloads) for r in run_index(spec, index)],
            schema=_arrow_schema(),
        )
    else:
        spark = build_session(master)
        cores = spark.sparkContext.defaultParallelism
        partitions = partitions or min(spec.workloads, max(cores * 4, 1))
        _warm_up(spark, cores)
        frame = spark.range(0, spec.workloads, numPartitions=partitions).mapInArrow(
            functools.partial(check_batches, spec_json=spec.model_dump_json()), RECORD_SCHEMA
        )
        stop = threading.Event()
        bar = threading.Thread(target=_progress, args=(spark, partitions, stop), daemon=True)
        if progress:
            bar.start()
        started = time.perf_counter()
        try:
            table = frame.toArrow()
        finally:
            stop.set()
            if progress:
                bar.join()
    elapsed = time.perf_counter() - started
    _write_parquet(table, out_dir / "records.parquet")
    records = table.to_pylist()
    summary = _summarize(spec, records, elapsed, cores, master)
    summary["divergences"] = _minimize_all(spec, records, out_dir, regressions_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return CheckReport(summary, records)


def warm_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side of the warm-up: import the checker, return nothing."""
    import cowstate_spec.differential  # noqa: F401

    for _ in batches:
        pass
    return iter(())


def _warm_up(spark: Any, cores: int) -> None:
    """Start one Python worker per core and import the checker in it, so the
    timed job measures checking, not interpreter start-up (workers are reused)."""
    spark.range(0, cores, numPartitions=cores).mapInArrow(warm_batches, "id long").collect()


def _write_parquet(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def _summarize(
    spec: WorkloadSpec, records: list[dict[str, Any]], elapsed: float, cores: int, master: str
) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    per_implementation: dict[str, dict[str, float]] = {}
    for record in records:
        counts.update(json.loads(record["operation_counts"]))
        stats = per_implementation.setdefault(
            record["implementation"], {"operations": 0, "task_seconds": 0.0}
        )
        stats["operations"] += record["applied"]
        stats["task_seconds"] += record["elapsed"]
    checked = sum(r["applied"] for r in records)
    return {
        "spec": spec.name,
        "master": master,
        "cores": cores,
        "workloads": spec.workloads,
        "implementations": spec.implementations,
        "operations_checked": checked,
        "elapsed_seconds": round(elapsed, 3),
        "ops_per_second": round(checked / elapsed, 1) if elapsed else 0.0,
        "ops_per_second_per_core": round(checked / elapsed / cores, 1) if elapsed else 0.0,
        "ops_per_task_second": {
            name: round(s["operations"] / s["task_seconds"], 1) if s["task_seconds"] else 0.0
            for name, s in per_implementation.items()
        },
        "operation_counts": dict(counts.most_common()),
        "divergences": [],
    }


def _minimize_all(
    spec: WorkloadSpec, records: list[dict[str, Any]], out_dir: Path, regressions_dir: Path | None
) -> list[dict[str, Any]]:
    found = []
    for record in records:
        if record["divergence_at"] is None:
            continue
        implementation = by_name(record["implementation"])
        ops = operations(spec, record["workload"])
        minimal = minimize(implementation, ops, initial_capacity=spec.initial_capacity)
        result = run_workload(
            implementation,
            minimal,
            workload=record["workload"],
            seed=record["seed"],
            check_every=1,
            initial_capacity=spec.initial_capacity,
        )
        trace, test = write_trace(
            out_dir / "traces",
            regressions_dir,
            implementation,
            minimal,
            result,
            spec.initial_capacity,
        )
        found.append(
            {
                "implementation": record["implementation"],
                "workload": record["workload"],
                "seed": record["seed"],
                "divergence_at": record["divergence_at"],
                "operation": record["divergence_operation"],
                "expected": record["expected"],
                "actual": (record["actual"] or "")[-2000:],
                "minimized_operations": len(minimal),
                "trace": str(trace),
                "regression_test": str(test) if test else None,
            }
        )
    return found


def _progress(spark: Any, partitions: int, stop: threading.Event) -> None:
    """A console progress bar over finished partitions (needs the SparkContext)."""
    try:
        tracker = spark.sparkContext.statusTracker()
    except Exception:  # Spark Connect: no SparkContext, no bar
        return
    width, last = 30, 0
    while not stop.wait(0.5):
        done = last  # a finished stage leaves the active list
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done = max(done, info.numCompletedTasks)
        if done != last:
            filled = width * done // partitions
            print(
                f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{partitions} partitions",
                end="",
                file=sys.stderr,
                flush=True,
            )
            last = done
    print(f"\r  [{'#' * width}] {partitions}/{partitions} partitions", file=sys.stderr, flush=True)
