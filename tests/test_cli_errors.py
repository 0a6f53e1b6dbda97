"""Every bad input of the ``cowstate`` command: one line, no traceback, the
documented exit status (2 bad input or usage, 3 environment), and nothing
lost (files the command was pointed at stay as they were).

Most cases run ``cowstate.cli.main`` in this process; the ones about the
environment (no Java, no Spark extra, a closed pipe) and Ctrl-C run
``python -m cowstate`` in a subprocess with that environment.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cowstate.cli import EXIT_DIVERGENCE, EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE, main
from cowstate_spec.local_cluster import free_port
from cowstate_spec.workloads import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]


def one_line(capsys: pytest.CaptureFixture[str], status: int, expected_status: int) -> str:
    """The single stderr line of a run that ended with ``expected_status``."""
    captured = capsys.readouterr()
    assert status == expected_status, captured.err
    assert "Traceback" not in captured.err
    assert "errors.pydantic.dev" not in captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def check(tmp_path: Path, *arguments: str) -> list[str]:
    """``cowstate check`` arguments with a valid source and --out unless given."""
    args = ["check", *arguments]
    if "--spec" not in arguments and "--preset" not in arguments:
        args += ["--preset", "tiny"]
    if "--out" not in arguments:
        args += ["--out", str(tmp_path / "out")]
    return args


def spec_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ spec files


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        ("bad.yaml", "workloads: [1, 2\nops: 3\n", "is not valid YAML (line 2, column"),
        ("bad.json", '{"workloads": 3,}', "is not valid JSON (line 1, column 17"),
        ("empty.yaml", "", "is empty, expected a mapping of spec fields"),
        ("list.yaml", "- 1\n- 2\n", "expected a mapping of spec fields, got list"),
        ("spec.txt", "workloads: 3\n", "expected a .json, .yaml or .yml file, got 'spec.txt'"),
        ("zero.yaml", "workloads: 0\n", "workloads: expected a number >= 1, got 0"),
        ("extra.yaml", "surprise: 1\n", "surprise: not a spec field (expected one of name,"),
        (
            "order.yaml",
            "release_order: sideways\n",
            "release_order: expected 'fifo', 'lifo' or 'random', got 'sideways'",
        ),
        ("impl.yaml", "implementations: [nope]\n", "implementations: expected one of cow-map,"),
        (
            "two.yaml",
            "workloads: -1\ncollision_share: 2\n",
            "workloads: expected a number >= 1, got -1; collision_share: expected a number <= 1",
        ),
        ("binary.yaml", "\udcff", "is not UTF-8 text"),
    ],
)
def test_a_bad_spec_file_is_one_line_naming_the_file_and_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, fragment: str
) -> None:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    before = path.read_bytes()
    line = one_line(capsys, main(check(tmp_path, "--spec", str(path))), EXIT_USAGE)
    assert line.startswith(f"cowstate check: --spec {str(path)!r}")
    assert fragment in line
    assert path.read_bytes() == before
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_a_missing_spec_file_and_a_directory_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.yaml"
    line = one_line(capsys, main(check(tmp_path, "--spec", str(missing))), EXIT_USAGE)
    assert line == (
        f"cowstate check: --spec {str(missing)!r} does not exist; expected a workload spec file"
    )
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    line = one_line(capsys, main(check(tmp_path, "--spec", str(folder))), EXIT_USAGE)
    assert line.endswith("is a directory, expected a workload spec file")


# ------------------------------------------------------------------ options


@pytest.mark.parametrize(
    "arguments, expected",
    [
        (
            ["--partitions", "-3"],
            "cowstate check: argument --partitions: expected an integer >= 1, got -3 "
            "(see cowstate check --help)",
        ),
        (["--partitions", "0"], "argument --partitions: expected an integer >= 1, got 0"),
        (["--ops", "0"], "argument --ops: expected an integer >= 1, got 0"),
        (["--workloads", "many"], "argument --workloads: expected an integer >= 1, got 'many'"),
        (["--seed", "-1"], "argument --seed: expected an integer >= 0, got -1"),
        (["--max-minimized", "-2"], "argument --max-minimized: expected an integer >= 0, got -2"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (
            ["--master", "nonsense://x"],
            "cowstate check: --master 'nonsense://x': expected local, local[N], local[*], "
            "local[N,F], local-cluster[N,C,M], spark://HOST:PORT[,HOST:PORT...], yarn, "
            "k8s://URL or in-process",
        ),
        (["--master", "local[0]"], "--master 'local[0]': expected local, local[N]"),
        (["--master", "spark://host"], "--master 'spark://host': expected local"),
        (["--implementation", "no-such-map"], "--implementation 'no-such-map': expected one of"),
        (["--preset", "nope", "--spec", "x.yaml"], "not allowed with argument"),
        (["--conf", "spark.x"], "--conf 'spark.x': expected KEY=VALUE"),
        (["--executor-timeout", "0"], "--executor-timeout: expected seconds > 0, got 0.0"),
        (
            ["--master", "in-process", "--partitions", "4"],
            "--partitions and --conf are Spark settings, expected neither with --master in-process",
        ),
    ],
)
def test_a_bad_option_is_one_line_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], expected: str
) -> None:
    line = one_line(capsys, main(check(tmp_path, *arguments)), EXIT_USAGE)
    assert expected in line
    assert "operations_per_workload" not in line
    assert not (tmp_path / "out").exists()


def test_an_unknown_preset_lists_the_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line(capsys, main(["check", "--preset", "nope"]), EXIT_USAGE)
    assert line == (
        "cowstate check: --preset 'nope': expected one of collisions, long-lived-snapshots, "
        "rehash-snapshots, rehash-under-snapshots, smoke, tables, tiny, zipf-hot-keys"
    )


def test_a_missing_source_is_a_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line(capsys, main(["check"]), EXIT_USAGE)
    assert "one of the arguments --spec --preset is required" in line


def test_no_command_and_an_unknown_command_are_usage_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = one_line(capsys, main([]), EXIT_USAGE)
    assert line.startswith("cowstate: the following arguments are required: COMMAND")
    line = one_line(capsys, main(["frobnicate"]), EXIT_USAGE)
    assert line.startswith("cowstate: argument COMMAND: invalid choice: 'frobnicate'")
    line = one_line(capsys, main(["savepoint", "inspect"]), EXIT_USAGE)
    assert line.startswith("cowstate savepoint inspect: the following arguments are required")


#: Directories no file system takes, as ``savepoint inspect DIR`` may be given
#: them (a NUL byte only through ``main()``: no shell passes one), and the refusal.
BAD_INSPECT_DIRECTORIES = {
    "nul": (
        "/data/sp\x00-1",
        "expected a snapshot directory without NUL or other control characters, got U+0000 "
        "at 8 in '/data/sp\\x00-1'",
    ),
    "overlong name": (
        "/data/" + "s" * 256,
        "expected a snapshot directory with every name between '/' of at most 255 bytes, got "
        f"one of 256 bytes: {'s' * 80!r} (of 256 characters)",
    ),
    "overlong path": (
        "/" + ("d" * 200 + "/") * 20 + "d" * 75,
        f"expected a snapshot directory of at most 4095 bytes, got 4096 bytes: "
        f"{('/' + 'd' * 200)[:80]!r} (of 4096 characters)",
    ),
    "a name that is no UTF-8": (
        os.fsdecode(b"/data/sp\xff"),
        "expected a snapshot directory of valid Unicode, got the lone surrogate U+DCFF at 8 in "
        "'/data/sp\\udcff'",
    ),
    "empty": ("", "expected a snapshot directory, got ''"),
}


@pytest.mark.parametrize("bad", sorted(BAD_INSPECT_DIRECTORIES))
def test_savepoint_inspect_of_a_directory_no_file_system_takes_is_one_line_saying_why(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: ``savepoint inspect`` of a directory holding a NUL byte, or a
    name of 256 bytes, said the directory does not exist. The line says what
    is wrong with the name (status 2, nothing printed)."""
    directory, message = BAD_INSPECT_DIRECTORIES[bad]
    status = main(["savepoint", "inspect", directory])
    captured = capsys.readouterr()
    assert (status, captured.out) == (EXIT_USAGE, "")
    program, said = captured.err.removesuffix("\n").split(": ", 1)
    assert program in ("cowstate", "cowstate savepoint inspect")  # its line's own prefix
    assert said == message


# ------------------------------------------------------------------ --out


def test_out_naming_a_file_is_refused_and_the_file_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "x"
    target.write_text("mine")
    status = main(check(tmp_path, "--out", str(target), "--master", "in-process"))
    line = one_line(capsys, status, EXIT_USAGE)
    assert line == f"cowstate check: --out {str(target)!r} is a file, expected a directory"
    assert target.read_text() == "mine"


def test_out_under_a_file_is_not_writable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("mine")
    target = tmp_path / "file" / "out"
    status = main(check(tmp_path, "--out", str(target), "--master", "in-process"))
    line = one_line(capsys, status, EXIT_USAGE)
    assert line == (
        f"cowstate check: --out {str(target)!r} is not a directory this user can write "
        "(Not a directory); expected a writable directory"
    )


def test_out_holding_records_no_check_wrote_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.parquet").write_text("someone else's")
    status = main(check(tmp_path, "--out", str(out), "--master", "in-process"))
    line = one_line(capsys, status, EXIT_USAGE)
    assert "holds a records.parquet that no check wrote" in line
    assert (out / "records.parquet").read_text() == "someone else's"


def test_regressions_dir_naming_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "regressions"
    target.write_text("mine")
    status = main(
        check(tmp_path, "--regressions-dir", str(target), "--master", "in-process", "--no-progress")
    )
    line = one_line(capsys, status, EXIT_USAGE)
    assert line.endswith("is a file, expected a directory")
    assert target.read_text() == "mine"


# ------------------------------------------------------------------ environment


def run_cowstate(
    arguments: list[str], env: dict[str, str] | None = None, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python -m cowstate`` in a subprocess (``prelude`` runs first)."""
    code = f"import sys\n{prelude}\nfrom cowstate.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *arguments],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_no_java_is_an_environment_line(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "JAVA_HOME": ""}
    result = run_cowstate(check(tmp_path, "--master", "local[1]"), env)
    line = assert_one_line(result, EXIT_ENVIRONMENT)
    assert line == (
        "cowstate check: Spark needs Java 17 or newer and found none (no JAVA_HOME, no java on "
        "PATH); install one (e.g. apt-get install openjdk-17-jre-headless) or run without "
        "Spark: --master in-process"
    )


def test_a_java_home_without_java_is_an_environment_line(tmp_path: Path) -> None:
    result = run_cowstate(check(tmp_path, "--master", "local[1]"), {"JAVA_HOME": str(tmp_path)})
    line = assert_one_line(result, EXIT_ENVIRONMENT)
    assert f"JAVA_HOME is {str(tmp_path)!r} but {tmp_path}/bin/java is not an executable" in line


def test_an_old_java_is_an_environment_line(tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    java.chmod(0o755)
    result = run_cowstate(check(tmp_path, "--master", "local[1]"), {"JAVA_HOME": str(tmp_path)})
    line = assert_one_line(result, EXIT_ENVIRONMENT)
    assert f"Spark 4 needs Java 17 or newer, found Java 11 at {java}" in line


def test_an_unreachable_master_is_an_environment_line(tmp_path: Path) -> None:
    port = free_port()
    result = run_cowstate(check(tmp_path, "--master", f"spark://127.0.0.1:{port}"))
    line = assert_one_line(result, EXIT_ENVIRONMENT)
    assert line.startswith(
        f"cowstate check: cannot reach the Spark master spark://127.0.0.1:{port}: "
        f"127.0.0.1:{port} (Connection refused); start it"
    )


#: Makes the spark extra's packages unimportable, as in an install without it.
WITHOUT_SPARK_EXTRA = """
class _NoSparkExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pyspark", "pyarrow", "pandas", "rich"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoSparkExtra())
"""


#: As in an install without the extra, where the spec's own finder answers last.
WITHOUT_SPARK_EXTRA_NAMED = """
from cowstate_spec import MissingExtraFinder
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        return MissingExtraFinder().find_spec(name, path, target)
sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.mark.parametrize(
    "prelude", [WITHOUT_SPARK_EXTRA, WITHOUT_SPARK_EXTRA_NAMED], ids=["bare", "extra-named"]
)
def test_without_the_spark_extra_spark_masters_say_what_to_install_once(
    tmp_path: Path, prelude: str
) -> None:
    # extra-named: the import error's own hint came too, and the line said it twice
    result = run_cowstate(check(tmp_path, "--master", "local[1]"), prelude=prelude)
    line = assert_one_line(result, EXIT_ENVIRONMENT)
    assert line == (
        "cowstate check: Spark is not installed here (No module named 'pyspark'); install it "
        "with: pip install 'cowstate[spark]', or run without Spark: --master in-process"
    )


def test_without_the_spark_extra_in_process_runs_and_writes_json_lines(tmp_path: Path) -> None:
    out = tmp_path / "out"
    arguments = check(tmp_path, "--master", "in-process", "--workloads", "3", "--ops", "200")
    result = run_cowstate([*arguments[:-2], "--out", str(out)], prelude=WITHOUT_SPARK_EXTRA)
    assert result.returncode == EXIT_OK, result.stderr
    assert (out / "records.jsonl").read_text().count("\n") == 3 * len(
        WorkloadSpec().implementations
    )
    assert not (out / "records.parquet").exists()
    assert "records.jsonl, summary.json" in result.stdout


def write_checkpoint(root: Path) -> str:
    """A checkpoint of one heap subtask with a few states; its directory."""
    from cowstate import HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor
    from cowstate.checkpoint import CheckpointCoordinator, CheckpointStorage

    with HeapKeyedStateBackend(KeyGroupRange(0, 127), 128) as backend:
        coordinator = CheckpointCoordinator(CheckpointStorage(str(root), "job"), [backend])
        for key in range(20):
            backend.set_current_key(key)
            backend.get_state(ValueStateDescriptor("clicks", default=0)).update(key)
        return coordinator.complete_checkpoint(coordinator.trigger_checkpoint()).directory


def test_a_closed_pipe_ends_inspect_and_check_quietly(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    for arguments in (
        ["savepoint", "inspect", str(checkpoint)],
        check(tmp_path, "--master", "in-process", "--workloads", "2", "--no-progress"),
    ):
        code = "import sys\nfrom cowstate.cli import main\nsys.exit(main(sys.argv[1:]))"
        process = subprocess.Popen(
            [sys.executable, "-c", code, *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader is gone before the command prints
        stderr = process.stderr.read()
        assert process.wait(timeout=300) == EXIT_OK, stderr
        assert stderr == ""


# ------------------------------------------------------------------ Spark failing


@pytest.mark.spark
def test_spark_that_cannot_start_is_an_environment_line(tmp_path: Path) -> None:
    arguments = check(tmp_path, "--master", "local[1]", "--conf", "spark.driver.memory=lots")
    line = assert_one_line(run_cowstate(arguments), EXIT_ENVIRONMENT)
    assert line.startswith("cowstate check: Spark could not start (")
    assert "lots" in line
    assert line.endswith("or run without Spark: --master in-process")


@pytest.mark.spark
def test_a_job_failing_on_the_executors_is_an_environment_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process, on the session tests/test_spark.py uses too (same
    master and settings): Spark's own report of the failure goes to the
    driver's log in --out, the console gets one line."""
    arguments = [
        "--master",
        "local[2]",
        "--conf",
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
        "--conf",
        "spark.pyspark.python=/nonexistent/python",
        "--no-progress",
    ]
    line = one_line(capsys, main(check(tmp_path, *arguments)), EXIT_ENVIRONMENT)
    assert line.startswith("cowstate check: the Spark job failed: java.io.IOException: Cannot run ")
    assert "/nonexistent/python" in line
    assert f"the driver's log is {tmp_path / 'out' / 'spark-driver.log'}" in line
    assert "Cannot run program" in (tmp_path / "out" / "spark-driver.log").read_text()


# ------------------------------------------------------------------ statuses


def test_agreement_is_0_and_a_divergence_is_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--master", "in-process", "--workloads", "2", "--ops", "300", "--no-progress"]
    status = main(check(tmp_path, *common, "--implementation", "cow-map"))
    assert status == EXIT_OK
    assert capsys.readouterr().err == ""
    out = tmp_path / "bad"
    status = main(
        check(
            tmp_path,
            *common,
            "--implementation",
            "bad-get-skips-state-copy",
            "--out",
            str(out),
            "--regressions-dir",
            str(tmp_path / "regressions"),
        )
    )
    assert status == EXIT_DIVERGENCE
    report = capsys.readouterr().out
    assert "minimized to" in report
    for line in report.splitlines():
        assert len(line) <= 200, line  # the minimized trace, never a whole state dump


def test_the_report_shows_the_minimized_trace_not_the_expected_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        check(
            tmp_path,
            "--master",
            "in-process",
            "--workloads",
            "1",
            "--ops",
            "2000",
            "--implementation",
            "bad-get-skips-state-copy",
            "--regressions-dir",
            str(tmp_path / "regressions"),
            "--no-progress",
        )
    )
    assert status == EXIT_DIVERGENCE
    report = capsys.readouterr().out
    summary: dict[str, Any] = json.loads((tmp_path / "out" / "summary.json").read_text())
    (divergence,) = summary["divergences"]
    for op in divergence["minimized_trace"]:
        assert f"        {op[0]}(" in report
    assert divergence["expected"] not in report or len(divergence["expected"]) < 160


# ------------------------------------------------------------------ Ctrl-C


def processes_of(marker: str) -> list[str]:
    """The command lines of the live processes whose environment holds
    ``COWSTATE_TEST_RUN=marker``: a run's Python, its JVM and the JVM's
    Python workers (each inherits the environment)."""
    needle = f"COWSTATE_TEST_RUN={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone, or another user's
            continue
    return found


def sigint_caught(pid: int) -> bool:
    """The process has a handler for SIGINT (its ``SigCgt`` mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:"))[7:], 16)
    return bool(caught & (1 << (signal.SIGINT - 1)))


def wait_until(what: str, done: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    """Poll ``done`` until it holds; fail if the run ends first (or in 10 minutes)."""
    deadline = time.monotonic() + 600
    while not done():
        assert process.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"expected {what} within 10 minutes"
        time.sleep(0.02)


def spark_submit_started(marker: str) -> bool:
    return any("org.apache.spark.deploy.SparkSubmit" in cmd for cmd in processes_of(marker))


#: When Ctrl-C comes: each moment is what the test waits for before sending it.
MOMENTS: dict[str, Callable[[subprocess.Popen[str], str, Path], bool]] = {
    # the command's handler is installed: imports, options, the Java check
    "before Spark is up": lambda process, marker, out: sigint_caught(process.pid),
    # the driver JVM exists and is starting (PySpark's launch_gateway waits for it)
    "while the JVM starts": lambda process, marker, out: spark_submit_started(marker),
    # the check job runs: its output committer set up records.parquet/_temporary
    "mid-run": lambda process, marker, out: (out / "records.parquet" / "_temporary").exists(),
}


@pytest.mark.spark
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_whenever_it_comes_is_one_line_status_130_and_stops_spark(
    tmp_path: Path, moment: str
) -> None:
    """Ctrl-C (SIGINT to the run's process group, as a terminal sends it) at
    three moments of a run on local[1]: one line, status 130, and no process
    of the run left -- its Python, its driver JVM, the JVM's Python workers.
    The run starts with SIGINT ignored, as a shell without job control starts
    a background command (``cowstate_spec.interrupt``, rule 1); mid-run the
    line replaces py4j's tracebacks (rule 3)."""
    marker = uuid.uuid4().hex
    out = tmp_path / "out"
    arguments = check(
        tmp_path,
        "--master",
        "local[1]",
        "--ops",
        "2000",  # a job long enough to be interrupted, were the test to wait less long
        "--conf",
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "--no-progress",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "cowstate", *arguments],
        env={**os.environ, "COWSTATE_TEST_RUN": marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, which the test interrupts
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        wait_until(moment, lambda: MOMENTS[moment](process, marker, out), process)
        if moment == "mid-run":
            running = processes_of(marker)
            assert any("SparkSubmit" in cmd for cmd in running), running
            assert any("pyspark.daemon" in cmd for cmd in running), running
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert (process.returncode, stderr) == (130, "cowstate check: interrupted\n"), stderr[-3000:]
    assert stdout == ""
    assert processes_of(marker) == []


def test_py4j_reports_of_broken_calls_are_dropped_once_an_interrupt_came() -> None:
    # Regression: a mid-run Ctrl-C on a loaded machine printed py4j's
    # "Exception while sending command." and a connection-reset traceback
    # before "cowstate check: interrupted" (the cancelled job had not
    # returned within the grace, so rule 3 ended the JVM under the call).
    from cowstate_spec import interrupt

    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    root, handler = logging.getLogger(), Keep()
    previous = signal.getsignal(signal.SIGINT)
    root.addHandler(handler)
    interrupt.reset()
    try:
        interrupt.install()
        interrupt.install()  # installed once, however often
        assert root.filters.count(interrupt._drop_broken_calls) == 1
        logging.error("Exception while sending command.")  # no interrupt yet: kept
        interrupt.take()
        for message in (*interrupt.BROKEN_CALL_MESSAGES, "another error"):
            logging.error(message)
    finally:
        root.removeHandler(handler)
        root.removeFilter(interrupt._drop_broken_calls)
        signal.signal(signal.SIGINT, previous)
        interrupt.reset()
    assert kept == ["Exception while sending command.", "another error"]


def test_ctrl_c_while_the_check_loads_is_one_line_status_130(tmp_path: Path) -> None:
    """Before ``cowstate_spec.cli`` takes SIGINT, ``cowstate.cli`` loads it:
    an interrupt there is the same line (here: raised by the import)."""
    prelude = (
        "class _Interrupted:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'cowstate_spec.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, _Interrupted())\n"
    )
    result = run_cowstate(check(tmp_path, "--master", "in-process"), prelude=prelude)
    assert (result.returncode, result.stderr) == (130, "cowstate check: interrupted\n")


#: A Ctrl-C that the code running it meets: the SIGINT handler raises in it.
CTRL_C = (
    "import os, signal\n"
    "os.kill(os.getpid(), signal.SIGINT)\n"
    "for _ in range(10**8):\n"  # the handler raises at the latest at the loop's first turn
    "    pass\n"
)
#: Where the wrapper of ``python -m cowstate`` makes ``meet_ctrl_c()`` run.
CTRL_C_MOMENTS = {
    # Python's own handler (as from a terminal); cowstate_spec.cli is being imported
    "while the check loads": (
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "class _Interrupted:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'cowstate_spec.cli':\n"
        "            meet_ctrl_c()\n"
        "sys.meta_path.insert(0, _Interrupted())\n"
    ),
    # the command's handler (cowstate_spec.interrupt) is installed
    "while the check runs": (
        "import cowstate_spec.cli\n"
        "def _validate_master(master, original=cowstate_spec.cli.validate_master):\n"
        "    meet_ctrl_c()\n"
        "    return original(master)\n"
        "cowstate_spec.cli.validate_master = _validate_master\n"
    ),
}


def ctrl_c_met_in(tmp_path: Path, moment: str, meet_ctrl_c: str) -> tuple[int, str, str]:
    """Status, stderr and stdout of ``cowstate check --master in-process``
    run as ``python -m cowstate`` runs it (runpy: the same exit path), by a
    wrapper where the function ``meet_ctrl_c`` (its source) runs at
    ``moment`` of :data:`CTRL_C_MOMENTS` and meets :data:`CTRL_C`."""
    wrapper = tmp_path / "ctrl_c_wrapper.py"
    wrapper.write_text(
        f"import runpy, signal, sys\nCTRL_C = {CTRL_C!r}\n{meet_ctrl_c}"
        f"{CTRL_C_MOMENTS[moment]}"
        "runpy.run_module('cowstate', run_name='__main__', alter_sys=True)\n"
    )
    arguments = check(tmp_path, "--master", "in-process", "--ops", "100", "--no-progress")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", wrapper.stem, *arguments],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return result.returncode, result.stderr, result.stdout


@pytest.mark.parametrize("moment", list(CTRL_C_MOMENTS))
def test_ctrl_c_met_in_code_compiled_from_a_string_is_status_130_not_death_by_sigint(
    tmp_path: Path, moment: str
) -> None:
    # Regression: "before Spark is up" died by SIGINT (-2) after its one line
    # now and then, when the Ctrl-C came while a dataclass was being made
    # (its methods are an exec() of a string): CPython records a
    # KeyboardInterrupt that leaves such code as unhandled even once caught,
    # and `python -m` exits by SIGINT for it (cowstate_spec.interrupt, rule 5).
    meet = "def meet_ctrl_c():\n    exec(CTRL_C)\n"
    status, stderr, stdout = ctrl_c_met_in(tmp_path, moment, meet)
    assert (status, stderr, stdout) == (130, "cowstate check: interrupted\n", "")


@pytest.mark.parametrize("moment", list(CTRL_C_MOMENTS))
def test_ctrl_c_met_in_a_descriptors_set_name_is_one_line_status_130(
    tmp_path: Path, moment: str
) -> None:
    # Regression: "before Spark is up" printed a traceback with status 1 when
    # the Ctrl-C came in a dataclass field's __set_name__: Python 3.11 turns
    # the KeyboardInterrupt into "RuntimeError: Error calling __set_name__"
    # (cowstate_spec.interrupt, rule 4). A code object, not a string: no
    # record of rule 5 is involved.
    meet = (
        "class _Descriptor:\n"
        "    def __set_name__(self, owner, name):\n"
        "        exec(compile(CTRL_C, 'ctrl_c', 'exec'))\n"
        "def meet_ctrl_c():\n"
        "    class _Made:\n"
        "        field = _Descriptor()\n"
    )
    status, stderr, stdout = ctrl_c_met_in(tmp_path, moment, meet)
    assert (status, stderr, stdout) == (130, "cowstate check: interrupted\n", "")


def test_an_error_is_raised_by_an_interrupt_when_one_is_in_its_chain() -> None:
    from cowstate.cli import raised_by_interrupt

    def chained(*links: BaseException, how: str) -> BaseException:
        """``links[0]`` raised while ``links[1]`` propagated, and so on."""
        for outer, inner in itertools.pairwise(links):
            setattr(outer, how, inner)
        return links[0]

    interrupt, error, other = KeyboardInterrupt, RuntimeError, ValueError
    assert raised_by_interrupt(interrupt())
    for how in ("__cause__", "__context__"):
        assert raised_by_interrupt(chained(interrupt(), error(), other(), how=how))  # first
        assert raised_by_interrupt(chained(error(), interrupt(), other(), how=how))  # middle
        assert raised_by_interrupt(chained(error(), other(), interrupt(), how=how))  # last
        assert not raised_by_interrupt(chained(error(), other(), error(), how=how))
    cycle = chained(error(), other(), how="__context__")
    cycle.__context__.__context__ = cycle  # type: ignore[union-attr]
    assert not raised_by_interrupt(cycle)
    both = error()
    both.__cause__, both.__context__ = other(), interrupt()  # the context counts too
    assert raised_by_interrupt(both)


def in_process_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[list[str], dict[str, Any]]:
    """The console report and the summary of a small in-process run."""
    arguments = ["--master", "in-process", "--workloads", "2", "--ops", "300", "--no-progress"]
    assert main(check(tmp_path, *arguments)) == EXIT_OK
    summary: dict[str, Any] = json.loads((tmp_path / "out" / "summary.json").read_text())
    return capsys.readouterr().out.splitlines(), summary


def test_the_report_says_1_core_and_2_cores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cowstate_spec.cli import format_summary

    report, summary = in_process_report(tmp_path, capsys)
    assert report[0] == "cowstate check: spec tiny on in-process (1 core)"
    assert format_summary({**summary, "cores": 2}, tmp_path).splitlines()[0].endswith("(2 cores)")


def test_the_report_shows_the_checked_operations_per_cpu_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, summary = in_process_report(tmp_path, capsys)
    assert summary["ops_per_cpu_second"] > 0
    assert (
        f"  ops/CPU-second     : {summary['ops_per_cpu_second']:,.0f} "
        f"({summary['cpu_seconds']:,.1f} CPU s checking)"
    ) in report


# ------------------------------------------------------------------ savepoint inspect


def inspect_line(capsys: pytest.CaptureFixture[str], target: str) -> str:
    return one_line(capsys, main(["savepoint", "inspect", target]), EXIT_USAGE)


def test_inspect_of_a_file_says_it_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    (tmp_path / "notes").write_text("mine")
    assert inspect_line(capsys, str(tmp_path / "notes")) == (
        "cowstate savepoint inspect: expected a completed checkpoint or savepoint in "
        f"{str(tmp_path / 'notes')!r}, but it is a file, not a directory"
    )
    metadata = f"{checkpoint}/_metadata"  # the file inside: its directory is meant
    assert inspect_line(capsys, metadata) == (
        "cowstate savepoint inspect: expected a completed checkpoint or savepoint in "
        f"{metadata!r}, but it is a file, not a directory (give the directory that holds it)"
    )
    assert (tmp_path / "notes").read_text() == "mine"


def test_inspect_of_an_unknown_scheme_names_the_path_as_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert inspect_line(capsys, "nosuch://bucket/sp-1") == (
        "cowstate savepoint inspect: expected a path or URL of a known file system, got "
        "'nosuch://bucket/sp-1': Protocol not known: nosuch"
    )


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_inspect_of_a_binary_metadata_shows_no_bytes_only_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    # 300 bytes with one byte outside printable ASCII: at the start, in the middle, at the end
    garbage = bytearray(b"x" * 300)
    garbage[{"first": 0, "middle": 150, "last": 299}[where]] = 0xFE
    (tmp_path / "_metadata").write_bytes(bytes(garbage))
    assert inspect_line(capsys, str(tmp_path)) == (
        f"cowstate savepoint inspect: expected {str(tmp_path / '_metadata')!r} to end with "
        "its seal line '#cowstate metadata v2 sha256=...', got binary data (300 bytes): the "
        "file is torn, truncated or not a cowstate document"
    )
