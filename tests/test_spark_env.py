"""Starting Spark for cowstate check, without starting it: master URLs, the
executors' Python, the driver JVM's output, the line a failed job becomes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from cowstate.errors import InvalidArgumentError
from cowstate_spec.spark_env import (
    CheckEnvironmentError,
    JvmOutput,
    executor_python,
    find_java,
    is_local,
    is_loopback,
    validate_master,
)
from cowstate_spec.spark_job import _reason


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[1]",
        "local[*]",
        "local[4,2]",
        "local-cluster[2,1,1024]",
        "spark://127.0.0.1:7077",
        "spark://a:7077,b:7078",
        "yarn",
        "k8s://https://k8s.example:6443",
        "in-process",
    ],
)
def test_spark_masters_are_accepted(master: str) -> None:
    assert validate_master(master) == master


@pytest.mark.parametrize(
    "master",
    [
        "nonsense://x",
        "local[0]",
        "local[-1]",
        "local[x]",
        "spark://host",
        "spark://:7077",
        "",
        "sc://h",
    ],
)
def test_anything_else_is_refused_naming_the_forms(master: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"expected local, local\[N\]"):
        validate_master(master)


def test_loopback_masters() -> None:
    assert is_local("local[2]") and is_loopback("local[2]")
    assert is_loopback("spark://127.0.0.1:7077") and is_loopback("spark://localhost:1,127.0.0.2:2")
    assert not is_loopback("spark://10.0.0.1:7077") and not is_local("spark://127.0.0.1:7077")
    assert not is_loopback("yarn")


def test_the_executors_python_follows_the_documented_order() -> None:
    conf = {"spark.pyspark.python": "/cluster/python"}
    env = {"PYSPARK_PYTHON": "/env/python"}
    assert executor_python(conf, "spark://h:1", env) == "/cluster/python"
    assert executor_python({}, "spark://h:1", env) == "/env/python"
    assert executor_python({}, "local[2]", {}) == sys.executable
    assert executor_python({}, "spark://h:1", {}) == "python3"


def test_java_is_found_through_java_home_or_the_path(tmp_path: Path) -> None:
    with pytest.raises(CheckEnvironmentError, match="found none"):
        find_java({"PATH": str(tmp_path)})
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'openjdk version \"21.0.1\" 2023-10-17' >&2\n")
    java.chmod(0o755)
    assert find_java({"JAVA_HOME": str(tmp_path / "jdk")}) == java
    assert find_java({"PATH": str(java.parent)}) == java
    java.write_text("#!/bin/sh\necho 'java version \"1.8.0_392\"' >&2\n")
    with pytest.raises(CheckEnvironmentError, match="found Java 8 at"):
        find_java({"JAVA_HOME": str(tmp_path / "jdk")})


def test_the_jvm_output_drops_start_up_noise_and_holds_the_rest_until_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = JvmOutput()
    output.sink.write(
        b"WARNING: Using incubator modules: jdk.incubator.vector\n"
        b"Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties\n"
        b"Invalid maximum heap size: -Xmxlots\n"
        b"Error: Could not create the Java Virtual Machine.\n"
    )
    output.sink.flush()
    assert output.first_problem() == "Invalid maximum heap size: -Xmxlots"
    assert capsys.readouterr().err == ""  # held back: the failure becomes one line
    log = tmp_path / "driver.log"
    output.log_to(log)
    output.started()
    output.sink.write(b"26/01/01 ERROR Executor: boom\n")
    output.sink.flush()
    output.drain()
    time.sleep(0.3)
    assert log.read_text().splitlines() == [
        "Invalid maximum heap size: -Xmxlots",
        "Error: Could not create the Java Virtual Machine.",
        "26/01/01 ERROR Executor: boom",
    ]
    assert capsys.readouterr().err == ""


def test_a_failed_job_is_named_by_its_cause() -> None:
    java = (
        "An error occurred while calling o170.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed, "
        "most recent failure: Lost task 0.0 (executor driver): java.io.IOException: Cannot run "
        'program "/x/python": error=2, No such file or directory\n'
        "\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)\n"
        "Caused by: java.io.IOException: error=2, No such file or directory\n"
    )
    assert _reason(Exception(java)) == (
        'java.io.IOException: Cannot run program "/x/python": error=2, No such file or directory'
    )
    python = (
        "\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "/w/pyspark.zip/pyspark/worker.py", line 1, in main\n'
        "ModuleNotFoundError: No module named 'pydantic'\n"
    )
    assert _reason(Exception(python)) == "ModuleNotFoundError: No module named 'pydantic'"
    assert _reason(Exception("something odd\nmore")) == "something odd"
