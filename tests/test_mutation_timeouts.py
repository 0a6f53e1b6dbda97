"""The per-test timeouts of mutation runs (``scripts/mutation_timeouts.py``).

A hanging mutant must end its run in seconds with exit status 36, which mutmut
and ``scripts/mutation.py`` count as "timeout"; a test that finishes in time
must be unaffected; the timeout follows the clean duration mutmut recorded.
Each case runs pytest in a subprocess on a tiny project with the plugin as its
``conftest.py``, exactly as the staged scopes do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "scripts" / "mutation_timeouts.py"

pytest.importorskip("pytest_timeout")


def _project(tmp_path: Path, body: str, durations: dict[str, float] | None = None) -> Path:
    shutil.copy(PLUGIN, tmp_path / "conftest.py")
    (tmp_path / "test_case.py").write_text(body)
    if durations is not None:
        (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": durations}))
    return tmp_path


def _run(project: Path, cap: float) -> tuple[int, float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--timeout={cap}"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, time.monotonic() - started, done.stdout + done.stderr


HANGS = "import time\n\ndef test_hangs():\n    while True:\n        time.sleep(0.01)\n"
BLOCKS = "import threading\n\ndef test_blocks():\n    threading.Event().wait()\n"
PASSES = "def test_passes():\n    assert sum(range(10)) == 45\n"


def test_a_hanging_test_ends_the_run_with_the_timeout_status(tmp_path: Path) -> None:
    code, elapsed, output = _run(_project(tmp_path, HANGS), cap=2)
    assert code == 36, output
    assert "mutation timeout: test_case.py::test_hangs ran over 2 s" in output
    assert elapsed < 60


def test_a_test_blocked_outside_the_interpreter_loop_is_ended_too(tmp_path: Path) -> None:
    code, _, output = _run(_project(tmp_path, BLOCKS), cap=2)
    assert code == 36, output


def test_a_test_that_finishes_in_time_passes(tmp_path: Path) -> None:
    code, _, output = _run(_project(tmp_path, PASSES), cap=2)
    assert code == 0, output


def test_the_timeout_follows_the_clean_duration_with_a_floor(tmp_path: Path) -> None:
    # clean duration 0.01 s: 10 x 0.01 is below the 10 s floor, and the cap (60) is
    # above it, so the hanging test is ended after the floor, not the cap.
    project = _project(tmp_path, HANGS, durations={"test_case.py::test_hangs": 0.01})
    code, elapsed, output = _run(project, cap=60)
    assert code == 36, output
    assert "ran over 10 s" in output
    assert elapsed < 55


HOLDS_THE_GIL = (
    "import os, sys, threading\n\n"
    "def test_holds_the_gil():\n"
    "    sys.setswitchinterval(1e6)  # the timer thread never gets the GIL\n"
    "    while True:\n"
    "        pass\n"
)


def test_a_hang_that_holds_the_gil_is_ended_by_the_backstop_alarm(tmp_path: Path) -> None:
    # The timer thread cannot run; SIGALRM's default action ends the process
    # 5 s after the timeout, with status -14 (counted as "timeout").
    code, elapsed, output = _run(_project(tmp_path, HOLDS_THE_GIL), cap=1)
    assert code == -14, output
    assert elapsed < 60
