"""The ``cowstate`` command (the console script, and ``python -m cowstate``).

Commands:

- ``cowstate savepoint inspect DIR`` prints what a checkpoint or savepoint
  holds (format, states, key groups per subtask, sizes, the shared files it
  uses outside its directory). It needs only the base install.
- ``cowstate check ...`` is the differential run of the specification
  (``cowstate check --help``). It runs in this process with the base install
  (``--master in-process``) and on Spark with the ``spark`` extra.
- ``cowstate --version`` prints the version.

Commands of other packages. This module imports nothing of the
specification: ``check`` is a command the specification package registers
under the entry point group :data:`COMMAND_GROUP` (``cowstate.commands``, in
``pyproject.toml``: ``check = "cowstate_spec.cli:main"``), as any installed
package may. A registered command is looked up by name (never loaded for
another command or for the help) and called with the arguments, its name
first; it returns the exit status. A name the program knows as another
package's (:data:`PLUG_IN_COMMANDS`) but finds no entry point for -- or two
-- is one line, status 3, saying what to install; a command that cannot be
imported is one line too. The commands of this module win over a plug-in of
the same name.

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

A Ctrl-C is the line ``cowstate <command>: interrupted`` and status 130,
and the process exits with the status the command returns, never by SIGINT
after its line: CPython counts a ``KeyboardInterrupt`` that left code
compiled from a string (the methods ``dataclasses`` makes) as unhandled
even once caught, and ``python -m`` then ends the process by SIGINT;
:func:`guarded` clears that record. An error raised from a
``KeyboardInterrupt`` is the interrupt too (:func:`raised_by_interrupt`).

A reader that stops reading early (``cowstate savepoint inspect DIR | head``)
ends the output quietly, with the status the command would have had.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import NoReturn

from cowstate.errors import InvalidArgumentError

__all__ = [
    "COMMAND_GROUP",
    "EXIT_DIVERGENCE",
    "EXIT_ENVIRONMENT",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_USAGE",
    "PLUG_IN_COMMANDS",
    "OneLineParser",
    "fail",
    "guarded",
    "inspect_command",
    "main",
    "print_output",
    "raised_by_interrupt",
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

#: The entry point group of the commands other packages add to ``cowstate``.
COMMAND_GROUP = "cowstate.commands"
#: The commands of other packages the program knows, by name: their line in
#: the help, and what to install when none is registered.
PLUG_IN_COMMANDS = {
    "check": (
        "differential run: implementations against the model (cowstate check --help)",
        "the differential run (cowstate_spec)",
    ),
}
#: What installs the commands of :data:`PLUG_IN_COMMANDS` (the specification
#: ships in the cowstate distribution; Spark runs need the spark extra).
INSTALL_HINT = "install it with: pip install 'cowstate[spark]'"
#: The commands this module runs itself.
BUILT_IN_COMMANDS = ("savepoint",)


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
    ``environment`` errors are 3, a ``KeyboardInterrupt`` or an error
    :func:`raised_by_interrupt` is 130 (and the process's status:
    :func:`_interrupt_handled`), argparse's exits keep their status."""
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
    except Exception as exc:
        if not raised_by_interrupt(exc):
            raise
        return fail(prog, "interrupted", EXIT_INTERRUPTED)
    finally:
        _interrupt_handled()  # whatever the body caught, the status is the command's


def raised_by_interrupt(exc: BaseException) -> bool:
    """``exc`` is a ``KeyboardInterrupt`` or was raised while one propagated
    (one is in its chain of ``__cause__`` and ``__context__``): Python 3.11
    turns what a descriptor's ``__set_name__`` raises into a
    ``RuntimeError`` from it, so a Ctrl-C that came while a dataclass was
    being made (its fields have one) arrived as that error."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if isinstance(current, KeyboardInterrupt):
            return True
        if id(current) not in seen:
            seen.add(id(current))
            todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    return False


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
    registered = _registered()
    if args and (args[0] in registered or args[0] in PLUG_IN_COMMANDS):
        return _run_plug_in(args, registered.get(args[0], []))
    return guarded("cowstate", lambda: _dispatch(args, registered))


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


def _registered() -> dict[str, list[EntryPoint]]:
    """The commands other packages register (:data:`COMMAND_GROUP`), by name,
    not loaded; a name of this module's own is left out."""
    found: dict[str, list[EntryPoint]] = {}
    for entry in entry_points(group=COMMAND_GROUP):
        if entry.name not in BUILT_IN_COMMANDS:
            found.setdefault(entry.name, []).append(entry)
    return found


def _run_plug_in(args: list[str], entries: list[EntryPoint]) -> int:
    """Load the one command registered as ``args[0]`` and run it; a missing,
    doubly registered or unloadable command is one line, status 3."""
    name = args[0]
    prog = f"cowstate {name}"
    if name in PLUG_IN_COMMANDS:
        what, hint = PLUG_IN_COMMANDS[name][1], INSTALL_HINT
    else:  # registered by a package this program knows nothing of
        what, hint = f"the command {name!r}", f"reinstall the package of {entries[0].value}"
    if not entries:
        return fail(
            prog,
            f"{what} is not installed: no package registers the command {name!r} (entry "
            f"point group {COMMAND_GROUP!r}); {hint}",
            EXIT_ENVIRONMENT,
        )
    if len(entries) > 1:
        return fail(
            prog,
            f"expected one package to register the command {name!r} (entry point group "
            f"{COMMAND_GROUP!r}), {len(entries)} do: "
            + ", ".join(sorted(entry.value for entry in entries))
            + "; uninstall all but one",
            EXIT_ENVIRONMENT,
        )
    try:
        command = entries[0].load()
    except ImportError as exc:
        return fail(prog, f"{what} could not be loaded ({exc}); {hint}", EXIT_ENVIRONMENT)
    except BaseException as exc:  # Ctrl-C while it loads; from then on, the command takes it
        if not raised_by_interrupt(exc):
            raise
        _interrupt_handled()
        return fail(prog, "interrupted", EXIT_INTERRUPTED)
    if not callable(command):
        return fail(
            prog,
            f"expected the command {name!r} ({entries[0].value}) to be a function of the "
            f"arguments, got {type(command).__name__}",
            EXIT_ENVIRONMENT,
        )
    return int(command(args))


def _parser(registered: dict[str, list[EntryPoint]]) -> OneLineParser:
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
    for name in sorted(registered):  # listed only: main() runs them before parsing
        if name in PLUG_IN_COMMANDS:
            summary = PLUG_IN_COMMANDS[name][0]
        else:
            summary = f"from {registered[name][0].value} (cowstate {name} --help)"
        commands.add_parser(name, add_help=False, help=summary)
    savepoint = commands.add_parser("savepoint", help="checkpoints and savepoints")
    savepoint_commands = savepoint.add_subparsers(
        dest="savepoint_command", required=True, metavar="COMMAND"
    )
    inspect = savepoint_commands.add_parser(
        "inspect", help="print what a checkpoint or savepoint directory holds"
    )
    inspect.add_argument("directory", help="a chk-<id> or savepoint directory (path or URL)")
    return parser


def _dispatch(args: list[str], registered: dict[str, list[EntryPoint]]) -> int:
    parsed = _parser(registered).parse_args(args)
    return inspect_command(parsed.directory)


def _interrupt_handled() -> None:
    """Forget CPython's record of a ``KeyboardInterrupt`` that left code
    compiled from a string, so that the process exits with the status the
    command chose. Every ``exec`` or ``eval`` of a string that a
    ``KeyboardInterrupt`` leaves records it as unhandled, even when it is
    caught later, and ``python -m`` ends the process by SIGINT for it after
    the exit status was set (Python 3.11 to 3.13 alike); each such run
    starts by clearing the record, so an empty one clears it."""
    exec("")


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
