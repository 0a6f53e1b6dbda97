"""A Spark standalone cluster on loopback, and executors' Python without cowstate.

What the cluster test (``tests/test_cluster.py``) and ``make cluster-demo``
run the check against, started from the installed pyspark the way its
documentation starts a standalone cluster by hand:

- :func:`executor_python` builds a virtual environment of the driver's
  Python version that holds only what PySpark's Python workers need for
  Arrow (``pyarrow``, the driver's version) -- no cowstate, no pydantic --
  so a run that succeeds proves the job shipped the checker
  (:mod:`cowstate_spec.shipping`). It is built once and reused.
- :class:`LocalCluster` starts a master and N workers
  (``spark-class org.apache.spark.deploy.master.Master`` and
  ``...worker.Worker``) bound to 127.0.0.1 on free ports, waits until every
  worker registered (the master's ``/json`` page), and stops exactly the
  processes it started, by their ids (``spark-class`` execs the JVM, so the
  id is the JVM's). Its ``conf_dir`` holds the cluster's
  ``spark-defaults.conf``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import TracebackType

__all__ = ["LocalCluster", "clean_environment", "executor_python", "free_port", "spark_home"]


#: JVM options for short runs on few cores: the client compiler only (no C2
#: compiler threads competing for the cores) and the serial collector.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> Path:
    """The directory of the installed pyspark (its ``bin/spark-class`` and jars)."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_environment() -> dict[str, str]:
    """This process's environment without what would let another Python find
    this one's packages (``PYTHONPATH``, ``PYSPARK_*``): what the cluster's
    processes, and so the executors' Python workers, start with."""
    hidden = ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    return {key: value for key, value in os.environ.items() if key not in hidden}


def executor_python(directory: Path) -> Path:
    """The ``bin/python`` of a virtual environment in ``directory`` with the
    driver's Python version and only ``pyarrow`` (built when missing or stale)."""
    requirement = f"pyarrow=={metadata.version('pyarrow')}"
    python = directory / "bin" / "python"
    stamp = directory / ".cowstate-executor"
    if python.exists() and stamp.exists() and stamp.read_text() == requirement:
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(directory)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ],
        check=True,
    )
    stamp.write_text(requirement)
    return python


class LocalCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1 (use as a
    context manager, or call :meth:`start` and :meth:`stop`)."""

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        defaults: Mapping[str, str] | None = None,
        directory: Path | None = None,
    ) -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self._owned_directory = directory is None
        self.directory = Path(
            tempfile.mkdtemp(prefix="cowstate-cluster-") if directory is None else directory
        )
        self.conf_dir = self.directory / "conf"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        settings = {
            "spark.driver.extraJavaOptions": QUICK_JVM,
            "spark.executor.extraJavaOptions": QUICK_JVM,
            **(defaults or {}),
        }
        lines = [f"{key} {value}" for key, value in settings.items()]
        (self.conf_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
        self.port = free_port()
        self.webui_port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> None:
        """Start the master and the workers; return once all registered."""
        try:
            self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", str(self.port)],
                ["--webui-port", str(self.webui_port)],
            )
            for index in range(self.workers):
                work = self.directory / f"worker-{index}"
                work.mkdir(exist_ok=True)
                self._spawn(
                    f"worker-{index}",
                    "org.apache.spark.deploy.worker.Worker",
                    [self.master, "--host", "127.0.0.1"],
                    [
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--webui-port",
                        str(free_port()),
                        "--work-dir",
                        str(work),
                    ],
                )
            self._wait_for_workers(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process this cluster started (by id): SIGTERM, then
        SIGKILL after 20 seconds. A directory the cluster made itself is
        removed; one it was given is left for its owner."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in reversed(self.processes):
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
        self.names = []
        if self._owned_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log(self, name: str) -> str:
        """The output of the process called ``name`` (``master``, ``worker-0`` ...)."""
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def environment(self) -> dict[str, str]:
        """An environment for a driver of this cluster: its conf directory."""
        return {**os.environ, "SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOCAL_IP": "127.0.0.1"}

    def _spawn(self, name: str, main_class: str, arguments: list[str], options: list[str]) -> None:
        environment = {
            **clean_environment(),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_WORKER_DIR": str(self.directory),
            "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM,
        }
        log = (self.directory / f"{name}.log").open("wb")
        self.names.append(name)
        with log:
            self.processes.append(
                subprocess.Popen(
                    [str(spark_home() / "bin" / "spark-class"), main_class, *arguments, *options],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=environment,
                    cwd=self.directory,
                )
            )

    def _wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        alive = 0
        while time.monotonic() < deadline:
            for name, process in zip(self.names, self.processes, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(
                        f"expected the cluster's processes to run, the {name} exited with "
                        f"status {process.returncode}; see {self.directory / name}.log"
                    )
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    state = json.loads(response.read())
                alive = sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")
                if alive >= self.workers:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(
            f"expected {self.workers} workers to register with {self.master} within "
            f"{timeout:.0f} s, got {alive}; see the logs in {self.directory}"
        )
