"""Starting Spark for ``cowstate check``: master URLs, Java, a quiet JVM, the
executors' Python.

Everything here runs on the driver before or while the session starts, and
turns each way a start can fail into one exception with one line of text:
:class:`~cowstate.errors.InvalidArgumentError` for what the user typed (exit
status 2), :class:`CheckEnvironmentError` for what the machine lacks (exit
status 3).

1. **Master URLs** are checked before anything starts (:func:`validate_master`):
   ``local``, ``local[N]``, ``local[*]``, ``local[N,F]``,
   ``local-cluster[N,C,M]``, ``spark://HOST:PORT[,HOST:PORT...]``, ``yarn``,
   ``k8s://URL``, or ``in-process`` (no Spark at all).
2. **Java**: Spark 4 needs Java 17 or newer (:func:`find_java`); a standalone
   master is probed over TCP before a JVM is started for it
   (:func:`check_reachable`), and the run waits a bounded time for its first
   executor (:func:`wait_for_executors`) instead of hanging on a cluster
   without workers.
3. **A quiet start**: the driver JVM's standard error is read through a pipe;
   the lines every start prints (the log4j profile, the default log level,
   the missing native Hadoop library, the incubator vector module) are
   dropped and every other line is passed on (:class:`JvmOutput`). Spark logs
   at ``ERROR`` unless ``--conf spark.log.level=...`` says otherwise.
4. **The executors' Python** is, in this order: ``spark.pyspark.python`` as
   the cluster's ``spark-defaults.conf`` or a ``--conf`` sets it, the
   driver's ``PYSPARK_PYTHON``, this interpreter for a ``local`` master, and
   ``python3`` (Spark's default) otherwise (:func:`executor_python`). PySpark
   itself reads only ``PYSPARK_PYTHON`` when the driver is a plain Python
   process, so a cluster's setting used to be overridden silently.
5. Under ``spark-submit`` the session, its master and its configuration are
   spark-submit's; ``--master`` and ``--conf`` of the command are not used.
   The driver JVM logs at ``ERROR`` before the session is made, unless
   ``spark.log.level`` is configured: its start-up lines printed before
   this Python started (Java's incubator module warning, the log4j profile)
   are spark-submit's, the context's INFO lines no longer come.
6. **Ctrl-C** (:mod:`cowstate_spec.interrupt`): the driver JVM starts in a
   process group of its own; an interrupt while it starts kills that group
   (PySpark's ``launch_gateway`` then fails at once) and is taken when the
   launch returns. The handler PySpark's context installs is replaced by
   ours, which cancels jobs over a connection of its own.
   :func:`stop_session` stops the context and ends the JVM this module
   started (its stdin closed: Spark's gateway exits on EOF; else SIGTERM,
   else SIGKILL to its group), and with the JVM its executors and Python
   workers, before the command exits.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Any

from cowstate.cli import raised_by_interrupt
from cowstate.errors import CowStateError, InvalidArgumentError
from cowstate_spec import interrupt

__all__ = [
    "IN_PROCESS",
    "MASTER_FORMS",
    "CheckEnvironmentError",
    "JvmOutput",
    "check_reachable",
    "executor_python",
    "find_java",
    "is_local",
    "is_loopback",
    "start_session",
    "stop_session",
    "under_spark_submit",
    "validate_master",
    "wait_for_executors",
]

#: The master that runs every workload in this process, without Spark.
IN_PROCESS = "in-process"
#: What ``--master`` accepts, as the error message says it.
MASTER_FORMS = (
    "local, local[N], local[*], local[N,F], local-cluster[N,C,M], "
    "spark://HOST:PORT[,HOST:PORT...], yarn, k8s://URL or in-process"
)
_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?"
    r"|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
    r"|spark://[^\s:/,]+:\d{1,5}(,[^\s:/,]+:\d{1,5})*"
    r"|yarn"
    r"|k8s://\S+"
)
_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
#: Lines every start of a driver JVM prints; nothing a user can act on.
_NOISE = re.compile(
    r"WARNING: Using incubator modules"
    r"|Using Spark's default log4j profile"
    r"|Setting default log level to"
    r"|Setting Spark log level to"
    r"|To adjust logging level use sc\.setLogLevel"
    r"|.*NativeCodeLoader: Unable to load native-hadoop library"
)
MINIMUM_JAVA = 17


class CheckEnvironmentError(CowStateError, RuntimeError):
    """The machine cannot run the check as asked: no Java, Spark missing or
    unable to start, a cluster out of reach or without executors, a job
    that failed on an executor. The message says what to do."""


def validate_master(master: str) -> str:
    """``master`` if it is a master URL Spark (or ``in-process``) accepts."""
    if master == IN_PROCESS or _MASTER.fullmatch(master):
        return master
    raise InvalidArgumentError(f"--master {master!r}: expected {MASTER_FORMS}")


def is_local(master: str) -> bool:
    """True for the masters whose executors are threads of the driver's JVM."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def is_loopback(master: str) -> bool:
    """True for local masters and standalone masters on this machine's loopback."""
    if is_local(master):
        return True
    if not master.startswith("spark://"):
        return False
    return all(
        host in _LOOPBACK_HOSTS or host.startswith("127.")
        for host, _ in _standalone_endpoints(master)
    )


def under_spark_submit() -> bool:
    """True when spark-submit started this process (its JVM is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def find_java(environ: Mapping[str, str] | None = None) -> Path:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java``, else the one on
    ``PATH``; version 17 or newer."""
    environ = os.environ if environ is None else environ
    java_home = environ.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            raise CheckEnvironmentError(
                f"JAVA_HOME is {java_home!r} but {java} is not an executable; expected a "
                f"Java {MINIMUM_JAVA}+ installation there (or use --master in-process)"
            )
    else:
        found = shutil.which("java", path=environ.get("PATH", os.defpath))
        if found is None:
            raise CheckEnvironmentError(
                f"Spark needs Java {MINIMUM_JAVA} or newer and found none (no JAVA_HOME, no "
                "java on PATH); install one (e.g. apt-get install openjdk-17-jre-headless) "
                "or run without Spark: --master in-process"
            )
        java = Path(found)
    version = _java_version(java)
    if version is not None and version < MINIMUM_JAVA:
        raise CheckEnvironmentError(
            f"Spark 4 needs Java {MINIMUM_JAVA} or newer, found Java {version} at {java}; "
            "set JAVA_HOME to a newer one or use --master in-process"
        )
    return java


def check_reachable(master: str, timeout: float = 5.0) -> None:
    """For a standalone master: at least one of its HOST:PORTs accepts a TCP
    connection (other masters are not probed)."""
    if not master.startswith("spark://"):
        return
    failures = []
    for host, port in _standalone_endpoints(master):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            failures.append(f"{host}:{port} ({exc.strerror or exc})")
    raise CheckEnvironmentError(
        f"cannot reach the Spark master {master}: {', '.join(failures)}; start it "
        "(spark-class org.apache.spark.deploy.master.Master) or use --master local[*]"
    )


def executor_python(conf: Mapping[str, str], master: str, environ: Mapping[str, str]) -> str:
    """The Python the executors run (rule 4 of the module docstring)."""
    configured = conf.get("spark.pyspark.python")
    if configured:
        return configured
    if environ.get("PYSPARK_PYTHON"):
        return environ["PYSPARK_PYTHON"]
    return sys.executable if is_local(master) else "python3"


class JvmOutput:
    """The driver JVM's standard error, read on a daemon thread.

    Drops the start-up lines (rule 3). Until :meth:`started` the other lines
    are held back: a start that fails is reported as one line naming its
    first problem (:meth:`first_problem`), not as the JVM's own lines. After
    it, lines go to the log file :meth:`log_to` names (``cowstate check``
    names ``OUT/spark-driver.log``, so Spark's own error reports of a failed
    job stay off the console), or to ``sys.stderr`` while none is named.

    The JVM writes into an unlinked temporary file (no pipe that could fill
    while nobody reads, no lost lines when the JVM dies during start-up) that
    this object reads through a descriptor of its own."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self._forwarding = False
        self._log: IO[str] | None = None
        self._lock = threading.Lock()
        handle, path = tempfile.mkstemp(prefix="cowstate-jvm-", suffix=".log")
        self.sink: IO[bytes] = os.fdopen(handle, "ab")
        self._source = open(path, "rb")  # noqa: SIM115 (read by the thread for its lifetime)
        os.unlink(path)
        self._thread = threading.Thread(target=self._pump, name="jvm-stderr", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """The JVM is up: write the lines held back, then every line as it comes."""
        self.drain()
        with self._lock:
            self._forwarding = True
            held, self.held = self.held, []
        for line in held:
            self._write(line)

    def log_to(self, path: Path | None) -> None:
        """Write the lines from now on to ``path`` (appended), or to stderr (None)."""
        self.drain()
        with self._lock:
            if self._log is not None:
                self._log.close()
            self._log = None if path is None else path.open("a", encoding="utf-8")

    def first_problem(self) -> str:
        """The first line the JVM wrote that is not start-up noise ('' if none)."""
        self.drain()
        with self._lock:
            return self.held[0].strip() if self.held else ""

    def drain(self, timeout: float = 2.0) -> None:
        """Wait until the reader caught up with what was written (bounded)."""
        deadline = time.monotonic() + timeout
        while (
            time.monotonic() < deadline
            and self._source.tell() < os.fstat(self.sink.fileno()).st_size
        ):
            time.sleep(0.05)

    def _pump(self) -> None:
        pending = b""
        while True:
            chunk = self._source.readline()
            if not chunk:
                time.sleep(0.1)
                continue
            pending += chunk
            if pending.endswith(b"\n"):
                self._line(pending.decode("utf-8", "replace").rstrip("\n"))
                pending = b""

    def _line(self, line: str) -> None:
        if _NOISE.match(line) or not line.strip():
            return
        with self._lock:
            if not self._forwarding:
                self.held.append(line)
                return
        self._write(line)

    def _write(self, line: str) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):  # closed: keep reading
            print(line, file=self._log or sys.stderr, flush=True)


def start_session(
    master: str,
    conf: Mapping[str, str],
    log: Path | None = None,
    app_name: str = "cowstate-check",
) -> tuple[Any, str]:
    """A SparkSession and the Python its executors run.

    Outside spark-submit: checks Java and the master first, starts the
    driver JVM quietly (rule 3), with the UI off, its output to ``log``.
    A session this module started is reused by a later call in the same
    process with the same master and settings (``spark.pyspark.python``
    aside: it is the Python side's, applied per call), else stopped with
    its JVM (:func:`stop_session`) and started anew. Under spark-submit:
    spark-submit's session.
    """
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession
    except ImportError as exc:  # its text may hold the hint already (MissingExtraFinder)
        raise CheckEnvironmentError(
            f"Spark is not installed here (No module named {exc.name or 'pyspark'!r}); install "
            "it with: pip install 'cowstate[spark]', or run without Spark: --master in-process"
        ) from None
    if under_spark_submit():
        SparkContext._ensure_initialized()  # spark-submit's JVM, to read its settings
        quiet = not SparkConf().contains("spark.log.level")
        if quiet:  # spark-submit logs at INFO: quiet before the context logs its start
            _quiet_driver_log(SparkContext._jvm)
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        if quiet:
            spark.sparkContext.setLogLevel("ERROR")
        _take_interrupts(spark.sparkContext)
        return spark, _set_executor_python(spark.sparkContext, {})
    active = SparkContext._active_spark_context
    wanted = (master, _without_python(conf))
    if active is not None and _STARTED.get("key") == wanted:
        if _OUTPUT:
            _OUTPUT[-1].log_to(log)
        _take_interrupts(active)
        return SparkSession(active), _set_executor_python(active, conf)
    if active is not None or SparkContext._gateway is not None:
        stop_session()  # a new context on the old JVM would ignore the new JVM's settings
    find_java()
    check_reachable(master)
    if is_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # bind and advertise loopback only
    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "ERROR",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
    }
    if is_loopback(master):
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(_without_python(conf))
    spark_conf = SparkConf(loadDefaults=False).setAll(sorted(settings.items()))
    context = _start_context(spark_conf, log)
    _STARTED["key"] = wanted
    return SparkSession(context), _set_executor_python(context, conf)


def stop_session(timeout: float = 30.0) -> None:
    """Stop the active SparkContext and end the driver JVM this module
    started, waiting for it at most ``timeout`` seconds, then SIGTERM and
    SIGKILL (rule 6). It runs on the way out of an interrupted or failed
    command, so it raises nothing of Spark's, and a Ctrl-C that comes while
    it runs only once it is done. Under spark-submit the JVM is
    spark-submit's and outlives this call; a process that never imported
    pyspark has nothing to stop."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    with interrupt.held():
        interrupt.session(None, None)
        context = SparkContext._active_spark_context
        gateway = SparkContext._gateway
        _quiet_accumulator_server()
        if context is not None:
            with contextlib.suppress(Exception):
                context.stop()
        process = getattr(gateway, "proc", None)
        if process is not None:
            with contextlib.suppress(Exception):
                gateway.close()  # type: ignore[union-attr]
            _end(process, timeout)
            SparkContext._gateway = None
            SparkContext._jvm = None
        _STARTED.clear()


def wait_for_executors(spark: Any, master: str, timeout: float) -> None:
    """For a standalone master: wait until one executor registered, at most
    ``timeout`` seconds (a cluster without free workers would hang the job
    without a word at log level ERROR)."""
    if not master.startswith("spark://"):
        return
    deadline = time.monotonic() + timeout
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    while len(tracker.getExecutorInfos()) < 2:  # the driver is listed too
        if time.monotonic() > deadline:
            raise CheckEnvironmentError(
                f"no executor registered with {master} within {timeout:.0f} s; check that "
                "workers are running and have the cores and memory the job asks for "
                "(--executor-timeout waits longer)"
            )
        time.sleep(0.25)


# ------------------------------------------------------------------ helpers


def _standalone_endpoints(master: str) -> list[tuple[str, int]]:
    endpoints = []
    for endpoint in master.removeprefix("spark://").split(","):
        host, _, port = endpoint.rpartition(":")
        endpoints.append((host, int(port)))
    return endpoints


def _java_version(java: Path) -> int | None:
    """The major version ``java -version`` reports (None if it says none)."""
    try:
        result = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckEnvironmentError(
            f"cannot run {java} -version ({exc}); expected a working Java {MINIMUM_JAVA}+ "
            "(or use --master in-process)"
        ) from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


#: The output reader of the driver JVM this process started (at most one lives).
_OUTPUT: list[JvmOutput] = []


def _start_context(spark_conf: Any, log: Path | None) -> Any:
    """Launch the driver JVM with its standard error into :class:`JvmOutput`
    and make the SparkContext on it."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    output = JvmOutput()
    output.log_to(log)
    _OUTPUT[:] = [output]
    try:
        with interrupt.held(abort=_abort_launch):  # rule 6
            gateway = launch_gateway(  # type: ignore[no-untyped-call]
                # its own process group: the JVM, and what spark-submit runs before it
                spark_conf,
                popen_kwargs={"stderr": output.sink, "process_group": 0},
            )
            # where stop_session finds it (SparkContext would put it there)
            SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm
        interrupt.session(None, functools.partial(_end_from_interrupt, gateway.proc))
        context = SparkContext(conf=spark_conf, gateway=gateway)
        _take_interrupts(context)
    except BaseException as exc:
        interrupted = raised_by_interrupt(exc) or interrupt.pending()
        if interrupted:
            interrupt.take()  # before stopping: nothing interrupts the stop
        stop_session()
        if interrupted:
            raise KeyboardInterrupt from None
        if not isinstance(exc, Exception):
            raise
        reason = output.first_problem() or _first_line(exc)
        raise CheckEnvironmentError(
            f"Spark could not start ({reason}); check JAVA_HOME and the --master and --conf "
            "settings, or run without Spark: --master in-process"
        ) from None
    output.started()
    return context


def _abort_launch(frame: FrameType | None) -> None:
    """Rule 6, Ctrl-C while the JVM starts: kill the process group of the
    ``spark-submit`` that ``launch_gateway`` (an interrupted frame) is
    waiting for, so that it fails at once instead of starting a JVM first."""
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, subprocess.Popen) and "spark-submit" in str(value.args):
                with contextlib.suppress(OSError):
                    os.killpg(value.pid, signal.SIGKILL)
                return
        frame = frame.f_back


def _take_interrupts(context: Any) -> None:
    """Rule 6: our SIGINT handler over the one PySpark's context installed,
    cancelling ``context``'s jobs over a connection of its own and, if that
    is not enough, ending the JVM this module started."""
    interrupt.install()
    process = getattr(context._gateway, "proc", None)  # None under spark-submit
    interrupt.session(
        context.cancelAllJobs,
        None if process is None else functools.partial(_end_from_interrupt, process),
    )


def _quiet_driver_log(jvm: Any) -> None:
    """Rule 5: spark-submit leaves Spark's logging uninitialized for the
    application, and the context's first log line would initialize it at
    INFO: initialize it now, then set ERROR (best effort: Spark's internals)."""
    with contextlib.suppress(Exception):
        utils = getattr(getattr(jvm.org.apache.spark.util, "Utils$"), "MODULE$")
        utils.initializeLogIfNecessary(False)
        jvm.org.apache.spark.util.Utils.setLogLevelIfNeeded("ERROR")


def _end_from_interrupt(process: Any) -> None:
    """End the JVM from the interrupt's thread (cowstate_spec.interrupt, rule 3)."""
    _quiet_accumulator_server()
    _end(process, 5.0)


def _quiet_accumulator_server() -> None:
    """The driver's accumulator server (a socketserver thread of PySpark's)
    prints a traceback for a connection the JVM drops while it stops; while
    this module stops the JVM, that is expected, not an error."""
    from pyspark import SparkContext

    server = getattr(SparkContext._active_spark_context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda request, address: None


def _end(process: Any, timeout: float) -> None:
    """End the driver JVM ``process``: its stdin closed (Spark's gateway exits
    on EOF), else SIGTERM, else SIGKILL to its process group."""
    with contextlib.suppress(OSError, ValueError):
        if process.stdin is not None:
            process.stdin.close()
    for stop in (None, signal.SIGTERM, signal.SIGKILL):
        if stop is not None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, stop)
        try:
            process.wait(timeout=timeout if stop is None else 10)
            return
        except subprocess.TimeoutExpired:
            continue


#: What the session this module started was started with: (master, settings).
_STARTED: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}


def _without_python(conf: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The settings that need a new driver JVM when they change."""
    return tuple(sorted((k, v) for k, v in conf.items() if k != "spark.pyspark.python"))


def _set_executor_python(context: Any, conf: Mapping[str, str]) -> str:
    """Apply rule 4 to ``context`` and this call's ``conf`` (PySpark reads
    ``pythonExec`` when it wraps a Python function for the executors, so it
    is never handed to the JVM) and return the choice."""
    settings = {key: value for key, value in context.getConf().getAll()}
    settings.update(conf)
    chosen = executor_python(settings, context.master, os.environ)
    context.pythonExec = chosen
    return chosen


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
