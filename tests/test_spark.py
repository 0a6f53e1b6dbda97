"""cowstate check on a real embedded Spark (local[2]): silent on the real map,
and it finds, reports and minimizes the bug of a broken one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cowstate_spec.cli import main
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
    "divergences",
}


def write_spec(tmp_path: Path, implementations: list[str]) -> Path:
    spec = WorkloadSpec(
        name="spark-test", workloads=6, operations_per_workload=600, implementations=implementations
    )
    path = tmp_path / "spec.yaml"
    spec.save(path)
    return path


def test_real_implementation_reports_no_divergence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, ["cow-map", "cow-map-128"])
    out = tmp_path / "out"
    code = main(
        ["check", "--spec", str(spec), "--master", "local[2]", "--out", str(out), "--no-progress"]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["divergences"] == []
    assert summary["workloads"] == 6
    assert summary["operations_checked"] == 6 * 600 * 2
    assert sum(summary["operation_counts"].values()) == summary["operations_checked"]
    assert summary["cores"] == 2 and summary["ops_per_second"] > 0
    import pyarrow.parquet as pq

    records = pq.read_table(out / "records.parquet").to_pylist()
    assert len(records) == 12
    assert {(r["implementation"], r["workload"]) for r in records} == {
        (i, w) for i in ("cow-map", "cow-map-128") for w in range(6)
    }
    assert "divergences        : 0" in capsys.readouterr().out


def test_broken_implementation_is_caught_and_minimized(
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
            "--no-progress",
        ]
    )
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    divergences = summary["divergences"]
    assert divergences, "the broken map was not caught"
    assert {d["implementation"] for d in divergences} == {"bad-get-skips-state-copy"}
    for d in divergences:
        assert 1 <= d["minimized_operations"] <= 15
        trace = json.loads(Path(d["trace"]).read_text())
        assert len(trace["operations"]) == d["minimized_operations"]
        assert Path(d["regression_test"]).is_file()
    assert "bad-get-skips-state-copy workload" in capsys.readouterr().out
