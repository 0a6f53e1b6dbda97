"""Ctrl-C in ``cowstate check``: one line, status 130, Spark stopped, whenever it comes.

A Python program gets Ctrl-C as a ``KeyboardInterrupt`` raised wherever its
main thread happens to be. A run on Spark spends its time in places where
that goes wrong, so ``cowstate check`` takes SIGINT itself, with these rules:

1. **Always honoured.** The handler is installed when the command starts
   (:func:`install`), also over a SIGINT its parent left ignored (a shell
   without job control starts background commands so). Python keeps an
   inherited ``SIG_IGN``, but PySpark's ``SparkContext`` installs its own
   handler regardless: the first seconds of a run ignored the Ctrl-C that
   the rest honoured.
2. **Aborted, not raised, while the driver JVM starts.** PySpark's
   ``launch_gateway`` keeps the JVM's process to itself until it returns,
   so an interrupt raised in it would orphan the JVM (which ignores SIGINT:
   PySpark starts it so). Inside :func:`held` an interrupt is recorded and
   handed to the block's ``abort`` with the interrupted frame
   (``spark_env`` kills the starting JVM's process group there, so the
   launch fails at once); it is raised when the block is over, or taken
   by the caller (:func:`pending`, :func:`take`) if the block failed.
   Stopping the session is held too, so that it runs to its end.
3. **Never raised inside a py4j call.** A ``KeyboardInterrupt`` there breaks
   the call's connection midway, and py4j logs each broken call with a
   traceback (PySpark's own handler, which cancels the jobs over that same
   connection, made about 45 lines of them). When the main thread is in
   py4j, a thread of ours cancels every Spark job over its own connection
   and re-delivers the interrupt every :data:`REDELIVER` seconds until the
   main thread takes it outside py4j -- when the cancelled job returns. A
   call that is no job (the session being made) cannot be cancelled: after
   :data:`GRACE` seconds the session's ``end`` ends the JVM, and the call
   fails. :func:`session` names how jobs are cancelled and the JVM ended.
   py4j reports such a broken call on the root logger ("Exception while
   sending command.", with the traceback of the reset connection): once an
   interrupt came, those reports are the interrupt's doing and a filter on
   the root logger (:func:`install`) drops them. A loaded machine met this:
   the cancelled job had not returned within the grace, and the run printed
   py4j's traceback before its one line.
4. **Taken once.** After the first interrupt is raised (or taken by a
   caller, who takes it *before* stopping the session), further Ctrl-Cs
   and re-deliveries are ignored, so the way out -- stopping the session
   and its JVM, bounded in time (``spark_env.stop_session``) -- is not
   itself interrupted halfway. An exception that comes while an interrupt
   is pending is the interrupt's doing (a cancelled job, a call to an ended
   JVM): the caller reports the interrupt instead. So is an error raised
   from the interrupt (``cowstate.cli.raised_by_interrupt``): Python 3.11
   turns what a descriptor's ``__set_name__`` raises into a
   ``RuntimeError`` from it, and a Ctrl-C that met a dataclass being made
   (its fields have one) printed that traceback with status 1.
5. **The command's status is the process's.** Wherever the interrupt is raised, the
   process exits with the status the command returns, not by SIGINT.
   CPython records a ``KeyboardInterrupt`` that leaves an ``exec`` or
   ``eval`` of a string as unhandled, even when a caller catches it, and
   ``python -m`` (``runpy``) ends the process by SIGINT for that record
   once the interpreter is finalized -- after the one line was printed,
   without a traceback. Those strings are everywhere while a run starts:
   ``dataclasses`` and ``namedtuple`` make their methods so, and a SIGINT
   that arrives while one is compiled is raised at the first instruction of
   the string's code. "Before Spark is up" (the imports) met this in 16 of
   60 runs of its steps: status -2 after "cowstate check: interrupted".
   The handler cannot avoid such code (the whole start-up is imports), so
   ``cowstate.cli.guarded``, where every interrupt ends up as status 130,
   clears the record (an ``exec`` of a string clears it when it starts).

The caller's side: ``cowstate_spec.cli`` installs the handler, turns what
comes while an interrupt is pending into it, stops the session on the way
out and prints the one line (``cowstate.cli.guarded``, rule 5);
``cowstate_spec.spark_env`` aborts the JVM's start, re-installs the handler
over PySpark's and names the session.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["GRACE", "REDELIVER", "held", "install", "pending", "reset", "session", "take"]

#: Seconds between re-deliveries of an interrupt that met a py4j call (rule 3).
REDELIVER = 0.1
#: Seconds a py4j call may go on after its jobs were cancelled (rule 3).
GRACE = 5.0


def install() -> None:
    """Make SIGINT this module's (rule 1) and drop py4j's reports of the calls
    an interrupt broke (rule 3); a no-op outside the main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)
        root = logging.getLogger()
        if _drop_broken_calls not in root.filters:
            root.addFilter(_drop_broken_calls)


@contextlib.contextmanager
def held(abort: Callable[[FrameType | None], object] | None = None) -> Iterator[None]:
    """Record, never raise, an interrupt while the block runs; call ``abort``
    with the interrupted frame at the first one (rule 2). A block that ends
    normally with an interrupt pending raises it."""
    state = _state
    previous = state.holding, state.abort
    state.holding, state.abort = True, abort
    try:
        yield
    finally:
        state.holding, state.abort = previous
    if pending() and not state.holding:
        raise take()


def session(cancel: Callable[[], object] | None, end: Callable[[], object] | None) -> None:
    """How rule 3 cancels the running Spark jobs and ends the JVM (None: it cannot)."""
    _state.cancel, _state.end = cancel, end


def pending() -> bool:
    """An interrupt came and nobody took it yet."""
    return _state.requested and not _state.taken


def take() -> KeyboardInterrupt:
    """The interrupt, marked as taken (rule 4): ``raise take()``."""
    _state.requested = _state.taken = True
    return KeyboardInterrupt()


def reset() -> None:
    """Forget any interrupt and session (a new command in the same process)."""
    global _state
    _state = _State()


# ------------------------------------------------------------------ helpers


class _State:
    def __init__(self) -> None:
        self.requested = False
        self.taken = False
        self.holding = False
        self.rescuing = False
        self.abort: Callable[[FrameType | None], object] | None = None
        self.cancel: Callable[[], object] | None = None
        self.end: Callable[[], object] | None = None


_state = _State()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    state = _state
    if state.taken:
        return  # rule 4
    first, state.requested = not state.requested, True
    if state.holding:  # rule 2
        if first and state.abort is not None:
            with contextlib.suppress(Exception):  # the block then ends as it would have
                state.abort(frame)
        return
    if _inside_py4j(frame):
        _rescue(state)  # rule 3
        return
    raise take()


#: What py4j's ``GatewayClient.send_command`` logs on the root logger for a
#: call whose connection broke (rule 3).
BROKEN_CALL_MESSAGES = (
    "Exception while sending command.",
    "KeyboardInterrupt while sending command.",
)


def _drop_broken_calls(record: logging.LogRecord) -> bool:
    """Rule 3: False (drop) for py4j's report of a broken call once an
    interrupt came; every other record passes."""
    return not (_state.requested and record.getMessage() in BROKEN_CALL_MESSAGES)


def _inside_py4j(frame: FrameType | None) -> bool:
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("py4j."):
            return True
        frame = frame.f_back
    return False


def _rescue(state: _State) -> None:
    """Rule 3: cancel the jobs over another connection, re-deliver the
    interrupt until the main thread takes it, end the JVM after the grace.
    The session is read as it is then: it may be named while this runs."""
    if state.rescuing:
        return
    state.rescuing = True

    def run() -> None:
        cancelled, ended, deadline = False, False, time.monotonic() + GRACE
        while state is _state and not state.taken:
            if not cancelled and state.cancel is not None:
                cancelled = True
                with contextlib.suppress(Exception):  # a JVM on its way out: nothing to cancel
                    state.cancel()
            if not ended and state.end is not None and time.monotonic() > deadline:
                ended = True
                with contextlib.suppress(Exception):
                    state.end()
            _thread.interrupt_main()
            time.sleep(REDELIVER)

    threading.Thread(target=run, name="cowstate-interrupt", daemon=True).start()
