"""The ``cowstate`` command (installed as a console script).

``cowstate savepoint inspect DIR`` prints what a checkpoint or savepoint holds
(format, states, key groups per subtask, sizes, the shared files it uses
outside its directory) and exits 1 when a file it lists is missing or has
another size, 2 when ``DIR`` holds no readable ``_metadata``. It needs only
the base install.

``cowstate check ...`` is the differential run of the specification
(``cowstate_spec.cli``; see ``cowstate check --help``); it needs the ``dev``
and ``spark`` extras.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["inspect_command", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "check":
        try:
            from cowstate_spec.cli import main as spec_main
        except ImportError as exc:
            print(
                f"cowstate check: the differential run needs the specification package "
                f"and its extras ({exc}); install them with: pip install "
                "'cowstate[dev,spark]'",
                file=sys.stderr,
            )
            return 2
        return int(spec_main(args))
    parser = argparse.ArgumentParser(
        prog="cowstate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "check",
        add_help=False,
        help="differential run: implementations vs the model (see cowstate check --help)",
    )
    savepoint = commands.add_parser("savepoint", help="checkpoints and savepoints")
    savepoint_commands = savepoint.add_subparsers(dest="savepoint_command", required=True)
    inspect = savepoint_commands.add_parser(
        "inspect", help="print what a checkpoint or savepoint directory holds"
    )
    inspect.add_argument("directory", help="a chk-<id> or savepoint directory (path or URL)")
    parsed = parser.parse_args(args)
    return inspect_command(parsed.directory)


def inspect_command(directory: str) -> int:
    """``cowstate savepoint inspect DIRECTORY``: print the report, return the exit status."""
    from cowstate.checkpoint.inspect import format_report, inspect_snapshot
    from cowstate.errors import CheckpointError

    try:
        report = inspect_snapshot(directory)
    except CheckpointError as exc:
        print(f"cowstate savepoint inspect: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
