"""Hard per-test timeouts for mutation runs (staged as ``build/mutation/<scope>/conftest.py``).

A mutant that loops forever (a rehash that never ends, a restore that waits on
a file that never comes) must fail in seconds, not after mutmut's CPU limit
(minutes for the slow machines). pytest-timeout arms one timer per test; this
plugin chooses how long and what happens when it fires:

- how long: ``max(FLOOR, FACTOR * d)`` seconds, where ``d`` is the test's
  duration in mutmut's clean run (``mutmut-stats.json``, written before any
  mutant runs), capped by ``--timeout``. Before that file exists (the clean
  and the statistics runs) the cap alone applies.
- what happens: the process ends at once with exit status 36, which mutmut
  and ``scripts/mutation.py`` count as "timeout" (a kill, reported in its own
  column). The timer is a thread, so a mutant that hangs outside the
  interpreter loop (in a blocking call) is ended too. A thread needs the
  GIL; if the hang holds it (a C call that never returns), SIGALRM, armed
  with its default action 5 s later, ends the process from the kernel
  (status -14, counted as "timeout" too).

Only mutation runs load this file; ``make test`` has no timeouts.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

FLOOR = 10.0
FACTOR = 10.0
BACKSTOP = 5.0
TIMEOUT_EXIT = 36
_durations: dict[str, float] | None = None


def _clean_duration(nodeid: str) -> float | None:
    global _durations
    if _durations is None:
        try:
            stats = json.loads(Path("mutmut-stats.json").read_text())
            _durations = {k: float(v) for k, v in stats.get("duration_by_test", {}).items()}
        except (OSError, ValueError):
            _durations = {}
    return _durations.get(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: Any, settings: Any) -> bool:
    cap = float(settings.timeout)
    clean = _clean_duration(item.nodeid)
    seconds = cap if clean is None else min(cap, max(FLOOR, FACTOR * clean))

    def fire() -> None:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:  # the message must reach the real stderr
            capture.suspend_global_capture(in_=True)
        sys.stderr.write(f"\nmutation timeout: {item.nodeid} ran over {seconds:.0f} s\n")
        sys.stderr.flush()
        os._exit(TIMEOUT_EXIT)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True

    backstop = threading.current_thread() is threading.main_thread()

    def cancel() -> None:
        timer.cancel()
        if backstop:
            signal.setitimer(signal.ITIMER_REAL, 0)

    item.cancel_timeout = cancel
    timer.start()
    if backstop:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, seconds + BACKSTOP)
    return True
