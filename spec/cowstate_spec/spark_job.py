"""The differential run: ``cowstate check``'s engine, on Spark or in process.

How a run flows on Spark (the rules are cited in the code):

1. **Indices, not operations.** The driver sends the spec (JSON, a few
   hundred bytes) and workload indices (``spark.range(n).mapInArrow``); each
   executor regenerates its workloads from (spec, index), runs every
   implementation of the spec against the model and emits one record per
   (workload, implementation).
2. **Executors write the records** (``DataFrame.write.parquet`` into
   ``OUT/records.parquet``, one part file per task). The driver never
   collects them.
3. **The summary is a Spark aggregation** over the written records: per
   implementation the records, operations, task seconds and divergent
   workloads, and the operation counts and event counts (snapshots in a
   rehash, interrupted iterations: the map columns exploded and summed).
4. **Only divergences come back, minimized by the executors.** Spark picks,
   per implementation, the first ``max_minimized`` diverging workloads by
   index; executors minimize them (delta debugging) and write
   ``OUT/divergences.parquet``; the driver reads those rows alone and writes
   a replayable trace and a pytest regression per row. Every divergent
   workload stays counted and recorded in ``records.parquet``.
5. **The driver's memory** is bounded by ``implementations x max_minimized``
   rows and a progress counter, never by the number of workloads.
6. **In process** (``--master in-process``), the same files and summary are
   computed by streaming: records are appended in chunks of
   :data:`CHUNK` workloads (Parquet with pyarrow, JSON lines
   ``records.jsonl`` without it, so the base install can run a check).
7. **Shipping**: when the executors' Python is not this interpreter, the
   checker travels with the job (:mod:`cowstate_spec.shipping`); the
   top-level packages of the spec's ``package.module:factory``
   implementations always do (``ship_modules``), and each executor starts
   its own child of a ``process:COMMAND`` implementation
   (:mod:`cowstate_spec.process_impl`).
8. **Timing**: ``elapsed_seconds`` is the wall time of the job of rule 2
   alone, after a warm-up job started one Python worker per core and
   imported the checker there (workers are reused); ``ops_per_second_per_core``
   divides by it and the cores. ``cpu_seconds`` adds up the CPU time the
   checking threads used (generating and checking the operations), so
   ``ops_per_cpu_second`` is the checker's own speed even on a machine whose
   cores other processes share.
9. **Output directory**: the run writes ``records.parquet`` (or
   ``records.jsonl``), ``divergences.parquet``, ``summary.json``,
   ``traces/`` and, on Spark, ``spark-driver.log`` (what the driver JVM
   printed after its start) in ``OUT`` and nothing else; it replaces a ``records.parquet``
   or ``divergences.parquet`` only if it looks like one a run wrote (part
   files and Spark's markers), and refuses to start otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cowstate.errors import InvalidArgumentError
from cowstate_spec.differential import WorkloadResult, minimize, run_workload, write_trace
from cowstate_spec.implementations import by_name
from cowstate_spec.progress import ProgressReporter, ProgressServer, display
from cowstate_spec.spark_env import (
    IN_PROCESS,
    CheckEnvironmentError,
    is_local,
    start_session,
    wait_for_executors,
)
from cowstate_spec.workloads import WorkloadSpec, decode, encode, operations, workload_seed

__all__ = [
    "CHUNK",
    "MINIMIZED_SCHEMA",
    "RECORD_SCHEMA",
    "CheckReport",
    "check_batches",
    "minimize_batches",
    "prepare_output",
    "record_arrow_schema",
    "run_check",
    "run_index",
]

#: The schema of one record (DDL, as mapInArrow takes it).
RECORD_SCHEMA = (
    "implementation string, workload long, seed string, operations long, applied long, "
    "elapsed double, cpu double, operation_counts map<string,long>, events map<string,long>, "
    "divergence_at long, "
    "divergence_operation string, expected string, actual string"
)
#: The schema of one minimized divergence (rule 4).
MINIMIZED_SCHEMA = (
    "implementation string, workload long, seed string, divergence_at long, "
    "divergence_operation string, expected string, actual string, "
    "minimized_operations string, minimized_expected string, minimized_actual string"
)
#: Workloads per Arrow batch an executor emits, and per chunk in process.
CHUNK = 64
#: How much of an expected or actual value a summary keeps.
_EXCERPT = 2000


@dataclass
class CheckReport:
    """What :func:`run_check` found (the content of ``summary.json``)."""

    summary: dict[str, Any]

    @property
    def divergences(self) -> list[dict[str, Any]]:
        return list(self.summary["divergences"])

    @property
    def diverged(self) -> bool:
        return any(self.summary["divergent_workloads"].values())


def run_check(
    spec: WorkloadSpec,
    out_dir: Path,
    master: str = "local[*]",
    partitions: int | None = None,
    regressions_dir: Path | None = None,
    progress: bool = True,
    max_minimized: int = 10,
    conf: dict[str, str] | None = None,
    executor_timeout: float = 120.0,
) -> CheckReport:
    """Run ``spec`` and write records, summary and traces into ``out_dir``.

    ``master`` is a Spark master URL, or ``"in-process"`` to run every
    workload in this process without Spark (same outputs, one core).
    Raises :class:`~cowstate.errors.InvalidArgumentError` for an unusable
    ``out_dir`` (before anything runs) and
    :class:`~cowstate_spec.spark_env.CheckEnvironmentError` when Spark
    cannot start or its job fails.
    """
    if partitions is not None and partitions < 1:
        raise InvalidArgumentError(f"expected partitions >= 1, got {partitions}")
    if max_minimized < 0:
        raise InvalidArgumentError(f"expected max_minimized >= 0, got {max_minimized}")
    prepare_output(out_dir)
    if master == IN_PROCESS:
        return _run_in_process(spec, out_dir, regressions_dir, progress, max_minimized)
    return _run_on_spark(
        spec,
        out_dir,
        master,
        partitions,
        regressions_dir,
        progress,
        max_minimized,
        conf or {},
        executor_timeout,
    )


def prepare_output(out_dir: Path) -> None:
    """Make sure ``out_dir`` is a writable directory that holds nothing the
    run would replace without owning it (rule 9)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidArgumentError(f"--out {str(out_dir)!r} is a file, expected a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise InvalidArgumentError(
            f"--out {str(out_dir)!r} is not a directory this user can write "
            f"({exc.strerror or exc}); expected a writable directory"
        ) from None
    for name in ("records.parquet", "divergences.parquet"):
        target = out_dir / name
        if target.exists() and not _written_by_a_run(target):
            raise InvalidArgumentError(
                f"--out {str(out_dir)!r} holds a {name} that no check wrote (expected part "
                "files only); move it or choose another --out"
            )


def run_index(spec: WorkloadSpec, index: int) -> list[dict[str, Any]]:
    """The records of workload ``index``: one per implementation of ``spec``
    (each record's ``cpu`` includes its share of generating the operations)."""
    started = time.thread_time()
    ops = operations(spec, index)
    share = (time.thread_time() - started) / len(spec.implementations)
    records = []
    for name in spec.implementations:
        record = run_workload(
            by_name(name),
            ops,
            workload=index,
            seed=workload_seed(spec, index),
            check_every=spec.check_every,
            initial_capacity=spec.initial_capacity,
        ).as_record()
        record["cpu"] += share
        records.append(record)
    return records


def check_batches(
    batches: Iterator[Any], spec_json: str, progress: tuple[str, int, str] | None = None
) -> Iterator[Any]:
    """Executor side of rule 1: run the workloads whose indices arrive in
    ``batches``, yield their records every :data:`CHUNK` workloads, and
    report each finished workload to the driver's progress server."""
    import pyarrow as pa

    spec = WorkloadSpec.model_validate_json(spec_json)
    schema = record_arrow_schema()
    reporter = ProgressReporter(progress)
    try:
        for batch in batches:
            indices = batch.column("id").to_pylist()
            for start in range(0, len(indices), CHUNK):
                records = []
                for index in indices[start : start + CHUNK]:
                    records.extend(run_index(spec, index))
                    reporter.finished()
                yield pa.RecordBatch.from_pylist(records, schema=schema)
    finally:
        reporter.close()


def minimize_batches(batches: Iterator[Any], spec_json: str) -> Iterator[Any]:
    """Executor side of rule 4: minimize the divergent records of ``batches``."""
    import pyarrow as pa

    spec = WorkloadSpec.model_validate_json(spec_json)
    schema = _minimized_schema()
    for batch in batches:
        rows = [_minimize_record(spec, record) for record in batch.to_pylist()]
        yield pa.RecordBatch.from_pylist(rows, schema=schema)


def warm_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side of the warm-up (rule 8): import the checker, return nothing."""
    import cowstate_spec.differential  # noqa: F401

    for _ in batches:
        pass
    return iter(())


# ------------------------------------------------------------------ on Spark


def _run_on_spark(
    spec: WorkloadSpec,
    out_dir: Path,
    master: str,
    partitions: int | None,
    regressions_dir: Path | None,
    progress: bool,
    max_minimized: int,
    conf: dict[str, str],
    executor_timeout: float,
) -> CheckReport:
    spark, python = start_session(master, conf, out_dir / "spark-driver.log")
    context = spark.sparkContext
    real_master = context.master
    with _job_errors(python, out_dir):
        wait_for_executors(spark, real_master, executor_timeout)
        cores = context.defaultParallelism
        if not context.getConf().contains("spark.sql.shuffle.partitions"):
            # the aggregations of rules 3 and 4 shuffle a few rows per task, not 200 partitions
            spark.conf.set("spark.sql.shuffle.partitions", str(max(cores * 2, 2)))
        archive = modules = None
        if not (is_local(real_master) and python == sys.executable):
            from cowstate_spec.shipping import ship

            archive = ship(context)  # rule 7
        user_modules = _user_modules(spec)
        if user_modules:  # rule 7: the user's own implementations, always
            from cowstate_spec.shipping import ship_modules

            modules = ship_modules(context, user_modules)
        run = functools.partial(_on_executors, archive=archive, modules=modules)
        partitions = partitions or min(spec.workloads, max(cores * 4, 1))
        records_uri = (out_dir / "records.parquet").resolve().as_uri()
        spec_json = spec.model_dump_json()
        spark.range(0, cores, numPartitions=cores).mapInArrow(
            run("cowstate_spec.spark_job:warm_batches", {}), "id long"
        ).collect()
        shown = display(spec.workloads, progress)
        server = _progress_server(context.getConf().get("spark.driver.host"), shown)
        started = time.perf_counter()
        finished = False
        try:
            frame = spark.range(0, spec.workloads, numPartitions=partitions).mapInArrow(
                run(
                    "cowstate_spec.spark_job:check_batches",
                    {"spec_json": spec_json, "progress": server.address if server else None},
                ),
                RECORD_SCHEMA,
            )
            frame.write.mode("overwrite").parquet(records_uri)  # rule 2
            elapsed = time.perf_counter() - started
            finished = True
        finally:
            if server is not None:
                server.close()
            shown.update(spec.workloads if finished else server.done if server else 0)
            shown.close()
        totals = _spark_totals(spark.read.parquet(records_uri))  # rule 3
        divergent = sum(s["divergent"] for s in totals["per_implementation"].values())
        minimized = (
            _spark_minimize(spark, records_uri, out_dir, spec_json, max_minimized, cores, run)
            if divergent and max_minimized
            else _no_divergences(out_dir)
        )
    summary = _summary(spec, totals, elapsed, cores, real_master, "records.parquet")
    summary["executor_python"] = python
    summary["shipped_archive"] = archive["name"] if archive else None
    summary["divergences"] = _write_findings(spec, minimized, out_dir, regressions_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return CheckReport(summary)


def _progress_server(host: str, shown: Any) -> ProgressServer | None:
    """The progress server on the driver's address, or None where it cannot
    listen (the run goes on; the display then jumps to the end)."""
    try:
        return ProgressServer(host, shown)
    except OSError:
        return None


def _on_executors(target: str, arguments: dict[str, Any], archive: Any, modules: Any = None) -> Any:
    """The function a job runs on the executors: :func:`shipping.executor_entry`
    bound to ``target`` (rule 7); module-level, so it pickles by reference."""
    from cowstate_spec.shipping import executor_entry

    return functools.partial(
        executor_entry, target=target, archive=archive, arguments=arguments, modules=modules
    )


def _user_modules(spec: WorkloadSpec) -> list[str]:
    """The top-level modules of the spec's ``package.module:factory``
    implementations (rule 7 ships them)."""
    from cowstate_spec.conformance import is_factory_name

    return sorted(
        {
            name.partition(":")[0].partition(".")[0]
            for name in spec.implementations
            if is_factory_name(name)
        }
    )


def _spark_totals(records: Any) -> dict[str, Any]:
    """Rule 3: the per-implementation totals and the operation counts."""
    from pyspark.sql import functions as f

    per_implementation = {
        row["implementation"]: {
            "records": row["records"],
            "operations": row["operations"] or 0,
            "task_seconds": row["task_seconds"] or 0.0,
            "cpu_seconds": row["cpu_seconds"] or 0.0,
            "divergent": row["divergent"] or 0,
        }
        for row in records.groupBy("implementation")
        .agg(
            f.count(f.lit(1)).alias("records"),
            f.sum("applied").alias("operations"),
            f.sum("elapsed").alias("task_seconds"),
            f.sum("cpu").alias("cpu_seconds"),
            f.sum(f.when(f.col("divergence_at").isNotNull(), 1).otherwise(0)).alias("divergent"),
        )
        .collect()
    }

    def summed(column: str) -> dict[str, int]:
        return {
            row["key"]: row["count"]
            for row in records.select(f.explode(column))
            .groupBy("key")
            .agg(f.sum("value").alias("count"))
            .collect()
        }

    return {
        "per_implementation": per_implementation,
        "operation_counts": summed("operation_counts"),
        "events": summed("events"),
    }


def _spark_minimize(
    spark: Any,
    records_uri: str,
    out_dir: Path,
    spec_json: str,
    max_minimized: int,
    cores: int,
    run: Any,
) -> list[dict[str, Any]]:
    """Rule 4: minimize on the executors, bring back the minimized rows only."""
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    divergences_uri = (out_dir / "divergences.parquet").resolve().as_uri()
    first = Window.partitionBy("implementation").orderBy("workload")
    chosen = (
        spark.read.parquet(records_uri)
        .where(f.col("divergence_at").isNotNull())
        .withColumn("rank", f.row_number().over(first))
        .where(f.col("rank") <= max_minimized)
        .drop("rank", "operation_counts", "events")
    )
    chosen.repartition(max(cores * 2, 1)).mapInArrow(
        run("cowstate_spec.spark_job:minimize_batches", {"spec_json": spec_json}),
        MINIMIZED_SCHEMA,
    ).write.mode("overwrite").parquet(divergences_uri)
    rows = spark.read.parquet(divergences_uri).orderBy("implementation", "workload").collect()
    return [row.asDict() for row in rows]


def _no_divergences(out_dir: Path) -> list[dict[str, Any]]:
    """No minimization job: an empty ``divergences.parquet`` (rule 9's files)."""
    _write_parquet_rows(out_dir / "divergences.parquet", [])
    return []


@contextlib.contextmanager
def _job_errors(python: str, out_dir: Path) -> Iterator[None]:
    """Turn a failed Spark job into one CheckEnvironmentError line."""
    try:
        yield
    except CheckEnvironmentError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in ("pyspark", "py4j"):
            raise
        raise CheckEnvironmentError(
            f"the Spark job failed: {_reason(exc)} (executors run {python}; the driver's log "
            f"is {out_dir / 'spark-driver.log'}, the executors' are in the workers' work "
            "directories)"
        ) from None


def _reason(exc: BaseException) -> str:
    """What a failed Spark job says went wrong: the last line of a Python
    traceback from an executor, else the first Java exception below Spark's
    own wrappers, else the first line."""
    text = str(exc)
    python: list[str] = re.findall(r"^([A-Za-z_]\w*(?:Error|Exception): .+)$", text, re.MULTILINE)
    if python:
        return python[-1].strip()[:300]
    wrappers = ("SparkException", "Py4JJavaError", "PythonException", "Py4JError")
    java = list(re.finditer(r"((?:[a-z_]\w*\.)+\w*(?:Error|Exception)): ", text))
    for position, here in enumerate(java):
        if here.group(1).endswith(wrappers):
            continue
        end = java[position + 1].start() if position + 1 < len(java) else len(text)
        message = (text[here.end() : end].splitlines() or [""])[0]
        return f"{here.group(1)}: {message.strip()}"[:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__


# ------------------------------------------------------------------ in process


def _run_in_process(
    spec: WorkloadSpec,
    out_dir: Path,
    regressions_dir: Path | None,
    progress: bool,
    max_minimized: int,
) -> CheckReport:
    """Rule 6: the same outputs, streamed, in this process."""
    writer = _RecordWriter(out_dir)
    per_implementation: dict[str, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    events: Counter[str] = Counter()
    chosen: dict[str, list[dict[str, Any]]] = {}
    shown = display(spec.workloads, progress)
    started = time.perf_counter()
    try:
        for index in range(spec.workloads):
            for record in run_index(spec, index):
                writer.add(record)
                _add_to_totals(per_implementation, counts, record)
                events.update(record["events"])
                if record["divergence_at"] is not None:
                    kept = chosen.setdefault(record["implementation"], [])
                    if len(kept) < max_minimized:
                        kept.append(record)
            shown.update(index + 1)
    finally:
        shown.close()
        writer.close()
    elapsed = time.perf_counter() - started
    minimized = [_minimize_record(spec, r) for name in sorted(chosen) for r in chosen[name]]
    _write_parquet_rows(out_dir / "divergences.parquet", minimized)
    totals = {
        "per_implementation": per_implementation,
        "operation_counts": dict(counts),
        "events": dict(events),
    }
    summary = _summary(spec, totals, elapsed, 1, IN_PROCESS, writer.name)
    summary["executor_python"] = sys.executable
    summary["shipped_archive"] = None
    summary["divergences"] = _write_findings(spec, minimized, out_dir, regressions_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return CheckReport(summary)


def _add_to_totals(
    per_implementation: dict[str, dict[str, Any]], counts: Counter[str], record: dict[str, Any]
) -> None:
    stats = per_implementation.setdefault(
        record["implementation"],
        {"records": 0, "operations": 0, "task_seconds": 0.0, "cpu_seconds": 0.0, "divergent": 0},
    )
    stats["records"] += 1
    stats["operations"] += record["applied"]
    stats["task_seconds"] += record["elapsed"]
    stats["cpu_seconds"] += record["cpu"]
    stats["divergent"] += record["divergence_at"] is not None
    counts.update(record["operation_counts"])


class _RecordWriter:
    """Records to ``records.parquet/part-00000.parquet`` (pyarrow) or to
    ``records.jsonl`` (without it), a chunk of :data:`CHUNK` workloads at a time."""

    def __init__(self, out_dir: Path) -> None:
        self._pending: list[dict[str, Any]] = []
        self._parquet: Any = None
        self._jsonl: Any = None
        try:
            import pyarrow.parquet as pq
        except ImportError:
            self.name = "records.jsonl"
            self._jsonl = (out_dir / self.name).open("w")
            return
        self.name = "records.parquet"
        directory = out_dir / self.name
        _replace_directory(directory)
        self._parquet = pq.ParquetWriter(directory / "part-00000.parquet", record_arrow_schema())

    def add(self, record: dict[str, Any]) -> None:
        self._pending.append(record)
        if len(self._pending) >= CHUNK:
            self._flush()

    def close(self) -> None:
        self._flush()
        if self._parquet is not None:
            self._parquet.close()
        if self._jsonl is not None:
            self._jsonl.close()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._parquet is not None:
            import pyarrow as pa

            self._parquet.write_batch(
                pa.RecordBatch.from_pylist(self._pending, schema=record_arrow_schema())
            )
        else:
            for record in self._pending:
                self._jsonl.write(json.dumps(record, sort_keys=True) + "\n")
        self._pending = []


def _write_parquet_rows(directory: Path, rows: list[dict[str, Any]]) -> None:
    """The minimized rows, as Spark would write them (skipped without pyarrow)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    _replace_directory(directory)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=_minimized_schema()), directory / "part-00000.parquet"
    )


# ------------------------------------------------------------------ shared


def _minimize_record(spec: WorkloadSpec, record: dict[str, Any]) -> dict[str, Any]:
    """Rule 4 for one divergent record: the minimized operations and what the
    minimized run expected and got."""
    implementation = by_name(record["implementation"])
    ops = operations(spec, record["workload"])
    try:
        minimal = minimize(implementation, ops, initial_capacity=spec.initial_capacity)
    except ValueError:  # it agrees when run again: keep the prefix that diverged
        minimal = ops[: record["divergence_at"] + 1]
    result = run_workload(
        implementation, minimal, check_every=1, initial_capacity=spec.initial_capacity
    )
    return {
        "implementation": record["implementation"],
        "workload": record["workload"],
        "seed": record["seed"],
        "divergence_at": record["divergence_at"],
        "divergence_operation": record["divergence_operation"],
        "expected": _excerpt(record["expected"]),
        "actual": _excerpt(record["actual"]),
        "minimized_operations": json.dumps([encode(op) for op in minimal]),
        "minimized_expected": _excerpt(result.expected),
        "minimized_actual": _excerpt(result.actual),
    }


def _write_findings(
    spec: WorkloadSpec,
    minimized: Iterable[dict[str, Any]],
    out_dir: Path,
    regressions_dir: Path | None,
) -> list[dict[str, Any]]:
    """A trace and a regression test per minimized divergence; their summary entries."""
    found = []
    for row in minimized:
        implementation = by_name(row["implementation"])
        ops = [decode(op) for op in json.loads(row["minimized_operations"])]
        result = WorkloadResult(
            row["implementation"],
            row["workload"],
            row["seed"],
            len(ops),
            expected=row["minimized_expected"],
            actual=row["minimized_actual"],
        )
        trace, test = write_trace(
            out_dir / "traces", regressions_dir, implementation, ops, result, spec.initial_capacity
        )
        found.append(
            {
                "implementation": row["implementation"],
                "workload": row["workload"],
                "seed": row["seed"],
                "divergence_at": row["divergence_at"],
                "operation": row["divergence_operation"],
                "expected": row["expected"],
                "actual": row["actual"],
                "minimized_operations": len(ops),
                "minimized_trace": json.loads(row["minimized_operations"]),
                "minimized_expected": row["minimized_expected"],
                "minimized_actual": row["minimized_actual"],
                "trace": str(trace),
                "regression_test": str(test) if test else None,
            }
        )
    return found


def _summary(
    spec: WorkloadSpec,
    totals: dict[str, Any],
    elapsed: float,
    cores: int,
    master: str,
    records: str,
) -> dict[str, Any]:
    per_implementation = totals["per_implementation"]
    checked = sum(s["operations"] for s in per_implementation.values())
    cpu = sum(s["cpu_seconds"] for s in per_implementation.values())
    counts = sorted(totals["operation_counts"].items(), key=lambda item: (-item[1], item[0]))
    return {
        "spec": spec.name,
        "master": master,
        "cores": cores,
        "workloads": spec.workloads,
        "operations_per_workload": spec.operations_per_workload,
        "implementations": spec.implementations,
        "records": records,
        "operations_checked": checked,
        "elapsed_seconds": round(elapsed, 3),
        "ops_per_second": round(checked / elapsed, 1) if elapsed else 0.0,
        "ops_per_second_per_core": round(checked / elapsed / cores, 1) if elapsed else 0.0,
        "cpu_seconds": round(cpu, 3),
        "ops_per_cpu_second": round(checked / cpu, 1) if cpu else 0.0,
        "ops_per_task_second": {
            name: round(s["operations"] / s["task_seconds"], 1) if s["task_seconds"] else 0.0
            for name, s in sorted(per_implementation.items())
        },
        "operation_counts": dict(counts),
        "events": dict(sorted(totals["events"].items())),
        "divergent_workloads": {
            name: per_implementation.get(name, {}).get("divergent", 0)
            for name in spec.implementations
        },
        "divergences": [],
        "skipped_checks": _skipped_checks(spec),
    }


def _skipped_checks(spec: WorkloadSpec) -> dict[str, list[str]]:
    """What each implementation lacks, by the checks that skips
    (:func:`cowstate_spec.conformance.skipped_checks`)."""
    from cowstate_spec.conformance import skipped_checks

    return {name: skipped_checks(by_name(name)) for name in spec.implementations}


def record_arrow_schema() -> Any:
    """:data:`RECORD_SCHEMA` as a pyarrow schema."""
    import pyarrow as pa

    return pa.schema(
        [
            ("implementation", pa.string()),
            ("workload", pa.int64()),
            ("seed", pa.string()),
            ("operations", pa.int64()),
            ("applied", pa.int64()),
            ("elapsed", pa.float64()),
            ("cpu", pa.float64()),
            ("operation_counts", pa.map_(pa.string(), pa.int64())),
            ("events", pa.map_(pa.string(), pa.int64())),
            ("divergence_at", pa.int64()),
            ("divergence_operation", pa.string()),
            ("expected", pa.string()),
            ("actual", pa.string()),
        ]
    )


def _minimized_schema() -> Any:
    import pyarrow as pa

    names = [part.strip().split(" ") for part in MINIMIZED_SCHEMA.split(",")]
    types = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, types[kind]) for name, kind in names])


def _excerpt(text: str | None) -> str | None:
    if text is None or len(text) <= _EXCERPT:
        return text
    return text[: _EXCERPT // 2] + " ... " + text[-_EXCERPT // 2 :]


def _written_by_a_run(directory: Path) -> bool:
    """Rule 9: a directory of part files and Spark's markers, nothing else."""
    if not directory.is_dir():
        return False
    for entry in directory.iterdir():
        name = entry.name.lstrip(".")
        if not entry.is_file() or not (
            name.startswith(("part-", "_SUCCESS", "_committed", "_started"))
        ):
            return False
    return True


def _replace_directory(directory: Path) -> None:
    """Empty ``directory`` (checked by :func:`prepare_output`) or create it."""
    if directory.exists():
        for entry in directory.iterdir():
            entry.unlink()
    directory.mkdir(parents=True, exist_ok=True)
