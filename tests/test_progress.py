"""Progress per finished workload: the driver's counter, the executors'
reporter, and the displays (rich on a terminal, plain lines otherwise)."""

from __future__ import annotations

import io
import socket
import threading
import time

from cowstate_spec.local_cluster import free_port
from cowstate_spec.progress import ProgressReporter, ProgressServer, display


class Recorder:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.closed = False

    def update(self, done: int) -> None:
        self.seen.append(done)

    def close(self) -> None:
        self.closed = True


def wait_for(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_server_counts_every_workload_the_reporters_finish() -> None:
    shown = Recorder()
    server = ProgressServer("127.0.0.1", shown)
    try:

        def task(workloads: int) -> None:
            reporter = ProgressReporter(server.address)
            for _ in range(workloads):
                reporter.finished()
            reporter.close()

        threads = [threading.Thread(target=task, args=(n,)) for n in (7, 11, 13)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wait_for(lambda: server.done == 31)
        assert shown.seen[-1] == 31
        assert shown.seen == sorted(shown.seen)
    finally:
        server.close()


def test_a_connection_without_the_token_is_not_counted() -> None:
    shown = Recorder()
    server = ProgressServer("127.0.0.1", shown)
    try:
        host, port, _ = server.address
        with socket.create_connection((host, port)) as stranger:
            stranger.sendall(b"\x00" * 16 + b"\x01" * 100)
        honest = ProgressReporter(server.address)
        honest.finished(3)
        honest.close()
        wait_for(lambda: server.done == 3)
        time.sleep(0.3)  # the stranger's bytes, had they counted, would be in by now
        assert server.done == 3
    finally:
        server.close()


def test_a_reporter_that_cannot_connect_goes_quiet() -> None:
    reporter = ProgressReporter(("127.0.0.1", free_port(), "00" * 16))
    reporter.finished()  # no exception: progress never fails a task
    reporter.finished()
    reporter.close()
    ProgressReporter(None).finished()


def test_lines_at_every_tenth_without_carriage_returns() -> None:
    stream = io.StringIO()
    shown = display(40, stream=stream)
    for done in range(1, 41):
        shown.update(done)
    shown.update(45)  # a retried task may report a workload twice
    shown.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("cowstate check: 4/40 workloads (10%), ")
    assert lines[-1].startswith("cowstate check: 40/40 workloads (100%), ")
    assert "\r" not in stream.getvalue()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_rich_progress_bar() -> None:
    stream = Terminal()
    shown = display(10, stream=stream)
    assert type(shown).__name__ == "_RichBar"
    for done in range(1, 11):
        shown.update(done)
    shown.close()
    assert "10/10" in stream.getvalue()
    silent = io.StringIO()
    display(10, enabled=False, stream=silent).update(5)
    assert silent.getvalue() == ""
