"""cowstate check on a real embedded Spark (local[2]): silent on the real map,
and it finds, reports and minimizes the bug of a broken one; the executors
write the records, Spark computes the summary, the executors minimize, and
the driver's memory does not grow with the number of workloads."""

from __future__ import annotations

import json
import shutil
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from cowstate_spec.cli import main
from cowstate_spec.conformance import CHECKS
from cowstate_spec.spark_job import run_check
from cowstate_spec.workloads import WorkloadSpec

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java (17)"),
]

SUMMARY_KEYS = {
    "workloads",
    "operations_checked",
    "ops_per_second",
    "ops_per_second_per_core",
    "operation_counts",
    "divergent_workloads",
    "divergences",
    "master",
    "executor_python",
}
#: Quicker JVMs for short test runs (see cowstate_spec.local_cluster.QUICK_JVM).
QUICK = ["--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1"]


def write_spec(tmp_path: Path, implementations: list[str], workloads: int = 6) -> Path:
    spec = WorkloadSpec(
        name="spark-test",
        workloads=workloads,
        operations_per_workload=600,
        implementations=implementations,
    )
    path = tmp_path / "spec.yaml"
    spec.save(path)
    return path


def records_of(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(out / "records.parquet").to_pylist())


def test_real_implementation_reports_no_divergence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, ["cow-map", "cow-map-128"])
    out = tmp_path / "out"
    arguments = ["--master", "local[2]", "--partitions", "3", "--out", str(out)]
    code = main(["check", "--spec", str(spec), *arguments, *QUICK])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["divergences"] == []
    assert summary["divergent_workloads"] == {"cow-map": 0, "cow-map-128": 0}
    assert summary["workloads"] == 6
    assert summary["master"] == "local[2]"
    assert summary["operations_checked"] == 6 * 600 * 2
    assert sum(summary["operation_counts"].values()) == summary["operations_checked"]
    assert summary["cores"] == 2 and summary["ops_per_second"] > 0
    # The executors wrote the records: one part file per task, the driver none.
    assert len(list((out / "records.parquet").glob("part-*.parquet"))) == 3
    assert (out / "records.parquet" / "_SUCCESS").is_file()
    records = records_of(out)
    assert len(records) == 12
    assert {(r["implementation"], r["workload"]) for r in records} == {
        (i, w) for i in ("cow-map", "cow-map-128") for w in range(6)
    }
    # Spark's aggregation agrees with the records it aggregated.
    counted: dict[str, int] = {}
    for record in records:
        for name, count in record["operation_counts"]:
            counted[name] = counted.get(name, 0) + count
    assert counted == summary["operation_counts"]
    captured = capsys.readouterr()
    assert "divergences        : 0" in captured.out
    # Progress: a line per tenth of the workloads on a stderr that is no
    # terminal, without carriage returns.
    assert "cowstate check: 6/6 workloads (100%)" in captured.err
    assert "\r" not in captured.err


def test_broken_implementation_is_caught_and_minimized_on_the_executors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, ["cow-map", "bad-get-skips-state-copy"])
    out = tmp_path / "out"
    regressions = tmp_path / "regressions"
    code = main(
        [
            "check",
            "--spec",
            str(spec),
            "--master",
            "local[2]",
            "--out",
            str(out),
            "--regressions-dir",
            str(regressions),
            "--max-minimized",
            "4",
            "--no-progress",
            *QUICK,
        ]
    )
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    # Every divergent workload is counted; the first four were minimized.
    assert summary["divergent_workloads"] == {"cow-map": 0, "bad-get-skips-state-copy": 6}
    divergences = summary["divergences"]
    assert [d["workload"] for d in divergences] == [0, 1, 2, 3]
    assert {d["implementation"] for d in divergences} == {"bad-get-skips-state-copy"}
    for d in divergences:
        assert 1 <= d["minimized_operations"] <= 15
        trace = json.loads(Path(d["trace"]).read_text())
        assert trace["operations"] == d["minimized_trace"]
        assert Path(d["regression_test"]).is_file()
    import pyarrow.parquet as pq

    minimized = pq.read_table(out / "divergences.parquet").to_pylist()
    assert sorted(r["workload"] for r in minimized) == [0, 1, 2, 3]
    assert all(len(json.loads(r["minimized_operations"])) <= 15 for r in minimized)
    assert sum(r["divergence_at"] is not None for r in records_of(out)) == 6
    report = capsys.readouterr().out
    assert "bad-get-skips-state-copy workload 0" in report
    assert "divergences        : 6 (bad-get-skips-state-copy 6)" in report


def test_the_drivers_memory_does_not_grow_with_the_workloads(tmp_path: Path) -> None:
    """Ten times the workloads, the same driver memory (Python allocations,
    traced); collecting the records as the old driver did would need several
    times the margin allowed, so the bound is not vacuous."""

    def peak(workloads: int) -> int:
        spec = WorkloadSpec(
            name="scale",
            workloads=workloads,
            operations_per_workload=1,
            implementations=["cow-map"],
        )
        tracemalloc.start()
        try:
            run_check(
                spec,
                tmp_path / f"out-{workloads}",
                master="local[2]",
                progress=False,
                conf={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"},
            )
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak(200)  # the session starts here, outside the comparison
    small, large = peak(2_000), peak(20_000)
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None
    tracemalloc.start()
    try:
        collected = spark.read.parquet(str(tmp_path / "out-20000" / "records.parquet"))
        rows = collected.toArrow().to_pylist()
        collect_cost = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(rows) == 20_000
    margin = 1_000_000
    assert collect_cost > 5 * margin, collect_cost
    assert large - small < margin, (small, large)


def test_another_executor_python_gets_the_checker_shipped_every_run(tmp_path: Path) -> None:
    """A local master whose executors run another Python (a wrapper here) is
    shipped the archive; a second run in the same session ships it again
    without Spark refusing the same file name."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    for run in (1, 2):
        out = tmp_path / f"out-{run}"
        code = main(
            [
                "check",
                "--preset",
                "tiny",
                "--workloads",
                "4",
                "--master",
                "local[2]",
                *QUICK,
                "--conf",
                f"spark.pyspark.python={wrapper}",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        assert code == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["executor_python"] == str(wrapper)
        assert summary["shipped_archive"].startswith("cowstate-executor-")
        assert summary["operations_checked"] == 4 * 500 * len(summary["implementations"])


def test_your_own_implementations_run_on_the_executors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``package.module:factory`` implementation imported by the executors from
    the shipped archive of its package, and a map behind the process protocol
    (one child per Python worker): both agree with the model; the summary names
    what each lacks."""
    tests = Path(__file__).resolve().parent
    monkeypatch.chdir(tests)
    out = tmp_path / "out"
    code = main(
        [
            "check",
            "--preset",
            "tiny",
            "--workloads",
            "4",
            "--master",
            "local[2]",
            *QUICK,
            "--implementation",
            "dict_map:DictMap",
            "--implementation",
            "cmap-process",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["divergent_workloads"] == {"dict_map:DictMap": 0, "cmap-process": 0}
    assert summary["operations_checked"] == 4 * 500 * 2
    # (the lifetimes of a child's states are out of reach: frees_states)
    assert summary["skipped_checks"]["cmap-process"] == [CHECKS["frees_states"]]
    assert len(summary["skipped_checks"]["dict_map:DictMap"]) == 2
