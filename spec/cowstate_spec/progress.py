"""Progress of ``cowstate check``: one tick per finished workload.

Spark tells the driver when a *task* ends; a task runs hundreds of
workloads. So the executors tell the driver themselves:

1. The driver opens a TCP socket on the address executors already use to
   reach it (``spark.driver.host``) and gives each task the address and a
   random token (:class:`ProgressServer`).
2. A task connects once, sends the token, then one byte per finished
   workload (:class:`ProgressReporter`). A reporter that cannot connect goes
   quiet: progress is a convenience, never a reason for a task to fail. A
   connection whose first bytes are not the token is closed unread.
3. The driver draws what it counts (:func:`display`): a rich progress bar
   when standard error is a terminal; otherwise (a log file, CI) plain lines
   at every tenth of the run, without a carriage return.

The driver holds a counter, never a list: its memory does not grow with the
number of workloads.
"""

from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import sys
import threading
import time
from typing import IO, Any, Protocol

__all__ = ["Display", "ProgressReporter", "ProgressServer", "display"]

_TOKEN_BYTES = 16


class Display(Protocol):
    """Something that shows ``done`` out of the run's total workloads."""

    def update(self, done: int) -> None: ...

    def close(self) -> None: ...


def display(total: int, enabled: bool = True, stream: IO[str] | None = None) -> Display:
    """The display for a run of ``total`` workloads on ``stream`` (stderr)."""
    stream = sys.stderr if stream is None else stream
    if not enabled or total <= 0:
        return _Silent()
    if stream.isatty():
        try:
            return _RichBar(total, stream)
        except ImportError:  # rich comes with the spark extra
            pass
    return _Lines(total, stream)


class ProgressServer:
    """Driver side: counts the workloads tasks report and updates ``shown``."""

    def __init__(self, host: str, shown: Display) -> None:
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self.done = 0
        self._shown = shown
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="progress", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int, str]:
        """(host, port, token in hex): what a :class:`ProgressReporter` needs."""
        host, port = self._listener.getsockname()[:2]
        return host, port, self.token.hex()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    if key.data is None:
                        self._accept(selector)
                    else:
                        self._read(selector, key.fileobj, key.data)  # type: ignore[arg-type]
        finally:
            for key in list(selector.get_map().values()):
                if key.data is not None:
                    key.fileobj.close()  # type: ignore[union-attr]
            selector.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        with contextlib.suppress(BlockingIOError):
            connection, _ = self._listener.accept()
            connection.setblocking(False)
            selector.register(connection, selectors.EVENT_READ, {"token": b""})

    def _read(
        self, selector: selectors.BaseSelector, connection: socket.socket, state: Any
    ) -> None:
        try:
            data = connection.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            selector.unregister(connection)
            connection.close()
            return
        if len(state["token"]) < _TOKEN_BYTES:
            missing = _TOKEN_BYTES - len(state["token"])
            state["token"] += data[:missing]
            data = data[missing:]
            if not self.token.startswith(state["token"]):
                selector.unregister(connection)
                connection.close()
                return
        if data and len(state["token"]) == _TOKEN_BYTES:
            self.done += len(data)
            self._shown.update(self.done)


class ProgressReporter:
    """Executor side: one byte per finished workload to the driver's server.

    ``address`` is :attr:`ProgressServer.address`, or None for no progress.
    Never raises: the first failure turns the reporter off.
    """

    def __init__(self, address: tuple[str, int, str] | None) -> None:
        self._address = address
        self._connection: socket.socket | None = None

    def finished(self, workloads: int = 1) -> None:
        if self._address is None:
            return
        try:
            if self._connection is None:
                host, port, token = self._address
                self._connection = socket.create_connection((host, port), timeout=5)
                self._connection.sendall(bytes.fromhex(token))
            self._connection.sendall(b"\x01" * workloads)
        except OSError:
            self.close()
            self._address = None

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.close()
            self._connection = None


# ------------------------------------------------------------------ displays


class _Silent:
    def update(self, done: int) -> None:
        pass

    def close(self) -> None:
        pass


class _Lines:
    """A line at every tenth of the run: ``cowstate check: 240/2,400 workloads (10%), 12 s``."""

    def __init__(self, total: int, stream: IO[str]) -> None:
        self._total = total
        self._stream = stream
        self._tenths = 0
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def update(self, done: int) -> None:
        with self._lock:
            tenths = min(10, done * 10 // self._total)
            if tenths > self._tenths:
                self._tenths = tenths
                elapsed = time.monotonic() - self._started
                share = done * 100 // self._total
                print(
                    f"cowstate check: {done:,}/{self._total:,} workloads ({share}%), "
                    f"{elapsed:.0f} s",
                    file=self._stream,
                    flush=True,
                )

    def close(self) -> None:
        pass


class _RichBar:
    """rich's progress bar: workloads done, rate, time left."""

    def __init__(self, total: int, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("cowstate check"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("workloads"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=stream),
            transient=False,
        )
        self._task = self._progress.add_task("check", total=total)
        self._progress.start()

    def update(self, done: int) -> None:
        self._progress.update(self._task, completed=done)

    def close(self) -> None:
        self._progress.stop()
