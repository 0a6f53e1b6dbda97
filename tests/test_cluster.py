"""``cowstate check`` on a real Spark standalone cluster on loopback, started
by the README's own commands.

The commands of the README's "On a cluster" section run as one bash script in
the checkout (``cowstate_spec.local_cluster.readme_cluster_script``, what
``make cluster-demo`` runs), with free ports instead of the README's, the
outputs in a temporary directory and nothing on ``PATH`` of the checkout's
venv. They build the executors' Python (pyarrow only: no cowstate, no
pydantic, so every run that succeeds proves the checker was shipped with the
job), set it as ``spark.pyspark.python`` in the cluster's
``spark-defaults.conf``, start a master and two workers (one core each) from
the installed pyspark, run the check two ways and stop the cluster:

- the README's ``cowstate check`` command with a planted bug added: the bug
  is caught and minimized on the cluster, the real map agrees;
- the README's ``spark-submit`` command (the full form only,
  ``COWSTATE_CLUSTER_FULL=1``: ``make test`` runs the reduced form, every
  command but this one, to save a driver and its two executors): 0
  divergences, the master spark-submit gave (not ``local[*]``), the
  operations counted, the executors' Python, the archive shipped, no Spark
  log line on the console;
- the full form also runs the commands as they stand, the ``cowstate
  check`` one like spark-submit's. It starts the cluster and two drivers
  once more.

The script runs in a process group of its own, stopped at the end whatever
it left running. The JVMs run with the client compiler and the serial
collector (``SPARK_DAEMON_JAVA_OPTS``, ``SPARK_SUBMIT_OPTS``, and for the
planted run's executors ``spark.executor.extraJavaOptions``): the machine
has two cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cowstate_spec.local_cluster import (
    QUICK_JVM,
    README_PORTS,
    clean_environment,
    free_port,
    readme_cluster_commands,
    readme_cluster_script,
)
from cowstate_spec.workloads import preset

pytestmark = [
    pytest.mark.spark,
    pytest.mark.cluster,
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java (17)"),
]

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent
EXECUTOR_PYTHON = ROOT / "build" / "executor-python" / "bin" / "python"
PLANTED = [
    "--workloads",
    "6",
    "--implementation",
    "c-map",
    "--implementation",
    "bad-get-skips-state-copy",
    # the executors' JVMs as quick as the daemons' and the driver's: with the
    # default compilers and collector the run cost twice the CPU (150 CPU s
    # machine-wide, 71 so, for the same check)
    "--conf",
    f"spark.executor.extraJavaOptions={QUICK_JVM}",
]
#: The full form (``make test`` runs the README's commands but spark-submit's).
FULL = os.environ.get("COWSTATE_CLUSTER_FULL") == "1"
#: The lines spark-submit prints before it starts the driver's Python.
SUBMIT_START = ("WARNING: Using incubator modules", "Using Spark's default log4j profile")


@dataclass
class ReadmeRun:
    """The README's cluster commands, run once: their output, the master they
    ran against, and the ``--out`` of the check and of spark-submit."""

    result: subprocess.CompletedProcess[str]
    master: str
    check_out: Path
    submit_out: Path


def cluster_test_script(
    ports: dict[int, int],
    outs: Sequence[Path],
    check_arguments: Sequence[str] = (),
    submit: bool = True,
) -> str:
    """The README's cluster commands as this test runs them: one script with
    the README's ports replaced by ``ports``, its two ``--out`` by ``outs``,
    ``check_arguments`` added to ``cowstate check``, the checkout's venv
    named by this interpreter's (the same one in a checkout) and, unless
    ``submit``, the spark-submit command left out -- nothing else changed
    (``tests/test_readme.py`` holds it to that)."""
    commands = [
        re.sub(r"(\$PWD/)?\.venv/", f"{VENV}/", line)
        for line in readme_cluster_commands((ROOT / "README.md").read_text())
        if submit or not is_spark_submit(line)
    ]
    return readme_cluster_script(commands, ports, [str(out) for out in outs], check_arguments)


def is_spark_submit(command: str) -> bool:
    """Whether ``command`` is the README's spark-submit command."""
    return command.startswith("$SPARK_HOME/bin/spark-submit ")


def run_readme_commands(
    directory: Path, check_arguments: Sequence[str] = (), submit: bool = True
) -> ReadmeRun:
    """The README's cluster commands as one script (free ports, outputs in
    ``directory``, ``check_arguments`` added to ``cowstate check``, the
    spark-submit command left out unless ``submit``)."""
    ports = {port: free_port() for port in README_PORTS}
    outs = [directory / "check", directory / "submit"]
    script = cluster_test_script(ports, outs, check_arguments, submit)
    environment = {
        **clean_environment(),
        # as copied into a shell: the venv's bin is not on PATH (it found no Spark so)
        "PATH": os.pathsep.join(
            entry
            for entry in os.environ.get("PATH", os.defpath).split(os.pathsep)
            if Path(entry).resolve() != (VENV / "bin").resolve()
        ),
        "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM,
        "SPARK_SUBMIT_OPTS": QUICK_JVM,
    }
    process = subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=1200)
    finally:
        for stop in (signal.SIGTERM, signal.SIGKILL):  # whatever the script left running
            try:
                os.killpg(process.pid, stop)
            except ProcessLookupError:
                break
            time.sleep(5)
        if process.poll() is None:
            process.communicate()
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return ReadmeRun(result, f"spark://127.0.0.1:{ports[7077]}", *outs)


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadmeRun]:
    directory = tmp_path_factory.mktemp("cluster")
    yield run_readme_commands(
        directory, [*PLANTED, "--regressions-dir", str(directory / "regressions")], submit=FULL
    )


def test_the_executors_python_has_no_cowstate(planted_run: ReadmeRun) -> None:
    modules = ("cowstate", "cowstate_spec", "pydantic", "yaml")
    probe = f"import importlib.util as u; print([m for m in {modules!r} if u.find_spec(m)])"
    found = subprocess.run(
        [str(EXECUTOR_PYTHON), "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=clean_environment(),
    )
    assert found.stdout.strip() == "[]", "the executors' Python must not have cowstate"


@pytest.mark.skipif(not FULL, reason="the full form: set COWSTATE_CLUSTER_FULL=1")
def test_the_readme_spark_submit_command_runs_on_the_cluster(planted_run: ReadmeRun) -> None:
    result = planted_run.result
    assert_clean_run(summary_of(planted_run.submit_out, result), planted_run.master)
    assert "divergences        : 0" in result.stdout
    # the driver's log4j is quiet as cowstate check's: only what spark-submit printed
    # before the driver's Python started (52 INFO lines around the report before);
    # nothing of the master or the workers either (their logs are files)
    spark_lines = [line for line in result.stderr.splitlines() if re.search(r" (INFO|WARN) ", line)]
    assert spark_lines == [], spark_lines[:5]
    assert_quiet(result.stderr)


def test_a_planted_bug_is_caught_and_minimized_on_the_cluster(planted_run: ReadmeRun) -> None:
    summary = summary_of(planted_run.check_out, planted_run.result)
    assert summary["master"] == planted_run.master
    assert summary["executor_python"] == str(EXECUTOR_PYTHON)
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

    minimized = pq.read_table(planted_run.check_out / "divergences.parquet").to_pylist()
    assert sorted(r["workload"] for r in minimized) == list(range(6))
    assert "bad-get-skips-state-copy workload 0" in planted_run.result.stdout


@pytest.mark.skipif(not FULL, reason="the full form: set COWSTATE_CLUSTER_FULL=1")
def test_the_readme_commands_as_they_stand_run_on_the_cluster(tmp_path: Path) -> None:
    run = run_readme_commands(tmp_path)
    assert_clean_run(summary_of(run.check_out, run.result), run.master)
    assert_clean_run(summary_of(run.submit_out, run.result), run.master)
    assert_quiet(run.result.stderr)


def summary_of(out: Path, result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert (out / "summary.json").is_file(), (result.stdout[-2000:], result.stderr[-3000:])
    return dict(json.loads((out / "summary.json").read_text()))


def assert_clean_run(summary: dict[str, Any], master: str) -> None:
    tiny = preset("tiny")
    assert summary["master"] == master
    assert summary["cores"] == 2
    assert summary["divergences"] == []
    assert set(summary["divergent_workloads"].values()) == {0}
    assert summary["workloads"] == tiny.workloads
    expected = tiny.workloads * tiny.operations_per_workload * len(summary["implementations"])
    assert summary["operations_checked"] == expected
    assert sum(summary["operation_counts"].values()) == expected
    assert summary["executor_python"] == str(EXECUTOR_PYTHON)
    assert re.fullmatch(r"cowstate-executor-[0-9a-f]{16}\.zip", summary["shipped_archive"])


def assert_quiet(stderr: str) -> None:
    """The driver JVMs' start-up lines did not reach the console (spark-submit's
    own, printed before its driver's Python started, aside)."""
    lines = [line for line in stderr.splitlines() if not line.startswith(SUBMIT_START)]
    for noise in ("log4j profile", "NativeCodeLoader", "incubator modules", "default log level"):
        assert not [line for line in lines if noise in line], noise
