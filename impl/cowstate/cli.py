"""The ``cowstate`` command (the console script, and ``python -m cowstate``).

Commands:

- ``cowstate savepoint inspect DIR`` prints what a checkpoint or savepoint
  holds (format, states, key groups per subtask, sizes, the shared files it
  uses outside its directory). It needs only the base install.
- ``cowstate check ...`` is the differential run of the specification
  (``cowstate_spec.cli``; ``cowstate check --help``). It runs in this process
  with the base install (``--master in-process``) and on Spark with the
  ``spark`` extra.
- ``cowstate --version`` prints the version.

Every command answers a problem with one line on standard error,
``cowstate <command>: <what is wrong>; <what to do>``, never a traceback, and
exits with one of :data:`EXIT_STATUSES`:

0. success: the check found no divergence, every file inspect lists exists;
1. a finding: a divergence (check), a listed file missing or of another size
   (inspect);
2. bad input or usage: an option, a spec file, an output directory, a
   directory without a readable ``_metadata``;
3. environment: no Java, Spark missing or unable to start, an extra not
   installed, a cluster out of reach, a Spark job that failed.

A reader that stops reading early (``cowstate savepoint inspect DIR | head``)
ends the output quietly, with the status the command would have had.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from cowstate.errors import InvalidArgumentError

__all__ = [
    "EXIT_DIVERGENCE",
    "EXIT_ENVIRONMENT",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_USAGE",
    "OneLineParser",
    "fail",
    "guarded",
    "inspect_command",
    "main",
    "print_output",
]

EXIT_OK = 0
EXIT_DIVERGENCE = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERRUPTED = 130
#: The exit statuses every command uses, as the help texts list them.
EXIT_STATUSES = {
    EXIT_OK: "success: no divergence (check), every listed file present (inspect)",
    EXIT_DIVERGENCE: "a finding: a divergence (check), a missing or resized file (inspect)",
    EXIT_USAGE: "bad input or usage: an option, a spec file, an output directory",
    EXIT_ENVIRONMENT: "environment: no Java, Spark missing or not starting, an extra not "
    "installed, a failed Spark job",
}


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def fail(prog: str, message: str, status: int) -> int:
    """Print ``prog: message`` as one line on standard error; return ``status``."""
    line = " ".join(message.split())
    print(f"{prog}: {line}", file=sys.stderr, flush=True)
    return status


def guarded(
    prog: str,
    body: Callable[[], int],
    environment: tuple[type[BaseException], ...] = (),
) -> int:
    """Run a command's ``body`` and turn what it raises into one line and a
    status: :class:`~cowstate.errors.InvalidArgumentError` is 2, the
    ``environment`` errors are 3, argparse's exits keep their status."""
    try:
        return body()
    except SystemExit as exc:  # argparse: --help (0), a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except environment as exc:
        return fail(prog, str(exc), EXIT_ENVIRONMENT)
    except InvalidArgumentError as exc:
        return fail(prog, str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return fail(prog, "interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_OK


def print_output(text: str) -> None:
    """Print ``text`` to standard output; a reader that went away (``| head``)
    is not an error: the rest is discarded."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _discard_stdout()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``cowstate`` command; returns its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["check"]:
        return _check(args)
    return guarded("cowstate", lambda: _dispatch(args))


def inspect_command(directory: str) -> int:
    """``cowstate savepoint inspect DIRECTORY``: print the report, return the exit status."""
    from cowstate.checkpoint.inspect import format_report, inspect_snapshot
    from cowstate.errors import CheckpointError

    try:
        report = inspect_snapshot(directory)
    except (CheckpointError, InvalidArgumentError) as exc:  # the latter: an unknown scheme
        return fail("cowstate savepoint inspect", str(exc), EXIT_USAGE)
    print_output(format_report(report))
    return EXIT_DIVERGENCE if report.problems else EXIT_OK


# ------------------------------------------------------------------ helpers


def _parser() -> OneLineParser:
    from cowstate import __version__

    parser = OneLineParser(
        prog="cowstate",
        description="Flink's heap keyed state in Python: inspect checkpoints and savepoints,\n"
        "and check the implementations against the reference model.",
        epilog="exit status:\n"
        + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_STATUSES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cowstate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "check",
        add_help=False,
        help="differential run: implementations against the model (cowstate check --help)",
    )
    savepoint = commands.add_parser("savepoint", help="checkpoints and savepoints")
    savepoint_commands = savepoint.add_subparsers(
        dest="savepoint_command", required=True, metavar="COMMAND"
    )
    inspect = savepoint_commands.add_parser(
        "inspect", help="print what a checkpoint or savepoint directory holds"
    )
    inspect.add_argument("directory", help="a chk-<id> or savepoint directory (path or URL)")
    return parser


def _dispatch(args: list[str]) -> int:
    parsed = _parser().parse_args(args)
    return inspect_command(parsed.directory)


def _check(args: list[str]) -> int:
    """Hand ``cowstate check`` to the specification package."""
    try:
        from cowstate_spec.cli import main as check_main
    except ImportError as exc:
        return fail(
            "cowstate check",
            f"the differential run could not be loaded ({exc}); install it with: "
            "pip install 'cowstate[spark]'",
            EXIT_ENVIRONMENT,
        )
    except KeyboardInterrupt:  # while it loads; from then on, check_main takes Ctrl-C
        return fail("cowstate check", "interrupted", EXIT_INTERRUPTED)
    return int(check_main(args))


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's final flush
    does not fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real descriptor (captured output)
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
