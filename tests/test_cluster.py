"""``cowstate check`` on a real Spark standalone cluster on loopback.

A master and two workers (one core each) started from the installed pyspark,
executors on a Python that has only pyarrow (no cowstate, no pydantic), so
every run that succeeds proves the checker was shipped with the job. The
executors' Python is set the way a cluster sets it: ``spark.pyspark.python``
in the cluster's ``spark-defaults.conf`` (``SPARK_CONF_DIR``). The commands
are the README's, copied from its "On a cluster" section; only the port, the
output directory and the checkout's venv are substituted.

- the README's ``spark-submit`` command: 0 divergences, the master
  spark-submit gave (not ``local[*]``), the operations counted, the
  executors' Python, the archive shipped;
- the README's ``cowstate check`` command with a planted bug added: the bug
  is caught and minimized on the cluster, the real map agrees;
- the README's ``cowstate check`` command as it stands (the full form; ``make
  cluster-demo`` runs the same command by hand): like spark-submit's. It
  starts one more driver and two more executors, so it runs only with
  ``COWSTATE_CLUSTER_FULL=1``.

The master and the workers are stopped by their process ids at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cowstate_spec.local_cluster import LocalCluster, clean_environment, executor_python
from cowstate_spec.workloads import preset

pytestmark = [
    pytest.mark.spark,
    pytest.mark.cluster,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java (17)"),
]

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent


def readme_command(prefix: str) -> str:
    """The README's cluster command that starts with ``prefix``."""
    section = (ROOT / "README.md").read_text().split("### On a cluster", 1)[1]
    for line in section.splitlines():
        if line.strip().startswith(prefix):
            return line.strip()
    raise AssertionError(f"the README has no cluster command starting with {prefix!r}")


def run_readme_command(
    prefix: str, cluster: LocalCluster, out: Path, extra: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the README's command in the checkout, against ``cluster``, with
    ``extra`` arguments appended, in the environment the README exports."""
    command = readme_command(prefix)
    command = command.replace("spark://127.0.0.1:7077", cluster.master)
    command = command.replace("--out out/cluster", f"--out {shlex.quote(str(out))}")
    command = re.sub(r"(\$PWD/)?\.venv/", f"{VENV}/", command)
    command += "".join(f" {shlex.quote(argument)}" for argument in extra)
    return subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=cluster.environment(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.fixture(scope="module")
def bare_python() -> Path:
    """The executors' Python: build/executor-python, with pyarrow only."""
    python = executor_python(ROOT / "build" / "executor-python")
    modules = ("cowstate", "cowstate_spec", "pydantic", "yaml")
    probe = f"import importlib.util as u; print([m for m in {modules!r} if u.find_spec(m)])"
    found = subprocess.run(
        [str(python), "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=clean_environment(),
    )
    assert found.stdout.strip() == "[]", "the executors' Python must not have cowstate"
    return python


@pytest.fixture(scope="module")
def cluster(bare_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("cluster")
    cluster = LocalCluster(
        workers=2, defaults={"spark.pyspark.python": str(bare_python)}, directory=directory
    )
    cluster.start()
    try:
        yield cluster
    finally:
        processes = list(cluster.processes)
        cluster.stop()
        assert all(p.poll() is not None for p in processes)


def summary_of(out: Path, result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert (out / "summary.json").is_file(), result.stderr[-3000:]
    return dict(json.loads((out / "summary.json").read_text()))


def assert_clean_run(summary: dict[str, Any], cluster: LocalCluster, python: Path) -> None:
    tiny = preset("tiny")
    assert summary["master"] == cluster.master
    assert summary["cores"] == 2
    assert summary["divergences"] == []
    assert set(summary["divergent_workloads"].values()) == {0}
    assert summary["workloads"] == tiny.workloads
    expected = tiny.workloads * tiny.operations_per_workload * len(summary["implementations"])
    assert summary["operations_checked"] == expected
    assert sum(summary["operation_counts"].values()) == expected
    assert summary["executor_python"] == str(python)
    assert re.fullmatch(r"cowstate-executor-[0-9a-f]{16}\.zip", summary["shipped_archive"])


def test_the_readme_spark_submit_command_runs_on_the_cluster(
    cluster: LocalCluster, bare_python: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_readme_command("PYSPARK_DRIVER_PYTHON=", cluster, out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_clean_run(summary_of(out, result), cluster, bare_python)
    assert "divergences        : 0" in result.stdout
    # the driver's log4j is quiet as cowstate check's: only what spark-submit printed
    # before the driver's Python started (52 INFO lines around the report before)
    assert [line for line in result.stderr.splitlines() if not line.startswith(SUBMIT_START)] == []


#: The lines spark-submit prints before it starts the driver's Python.
SUBMIT_START = ("WARNING: Using incubator modules", "Using Spark's default log4j profile")


@pytest.mark.skipif(
    os.environ.get("COWSTATE_CLUSTER_FULL") != "1",
    reason="the full form: set COWSTATE_CLUSTER_FULL=1",
)
def test_the_readme_check_command_runs_on_the_cluster(
    cluster: LocalCluster, bare_python: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_readme_command(".venv/bin/cowstate check", cluster, out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_clean_run(summary_of(out, result), cluster, bare_python)
    assert_quiet(result.stderr)


def test_a_planted_bug_is_caught_and_minimized_on_the_cluster(
    cluster: LocalCluster, bare_python: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    planted = [
        "--workloads",
        "6",
        "--implementation",
        "c-map",
        "--implementation",
        "bad-get-skips-state-copy",
        "--regressions-dir",
        str(tmp_path / "regressions"),
    ]
    result = run_readme_command(".venv/bin/cowstate check", cluster, out, planted)
    assert result.returncode == 1, result.stderr[-3000:]
    summary = summary_of(out, result)
    assert summary["master"] == cluster.master
    assert summary["executor_python"] == str(bare_python)
    assert summary["divergent_workloads"] == {"c-map": 0, "bad-get-skips-state-copy": 6}
    divergences = summary["divergences"]
    assert len(divergences) == 6
    for d in divergences:
        assert d["implementation"] == "bad-get-skips-state-copy"
        assert 1 <= d["minimized_operations"] <= 15
        assert len(json.loads(Path(d["trace"]).read_text())["operations"]) == len(
            d["minimized_trace"]
        )
        assert Path(d["regression_test"]).is_file()
    import pyarrow.parquet as pq

    minimized = pq.read_table(out / "divergences.parquet").to_pylist()
    assert sorted(r["workload"] for r in minimized) == list(range(6))
    assert "bad-get-skips-state-copy workload 0" in result.stdout
    assert_quiet(result.stderr)


def assert_quiet(stderr: str) -> None:
    """The driver JVM's start-up lines did not reach the console."""
    for noise in ("log4j profile", "NativeCodeLoader", "incubator modules", "default log level"):
        assert noise not in stderr
