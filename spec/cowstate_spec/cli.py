"""``cowstate check``: the differential run from the command line.

``cowstate check`` runs the workloads of a spec (``--spec FILE`` or
``--preset NAME``) against every implementation it names and the reference
model -- on Spark (``--master``, default ``local[*]``) or ``in-process`` --
writes ``records.parquet``, ``divergences.parquet``, ``summary.json`` and
minimized traces into ``--out``, and prints a short report.

Every problem is one line on standard error, ``cowstate check: <what is
wrong>; <what to do>``, never a traceback, with the exit status of
:mod:`cowstate.cli` (0 agreement, 1 divergence, 2 bad input or usage,
3 environment; 130 interrupted: Ctrl-C, whenever it comes, stops Spark and
its executors and prints one line, see :mod:`cowstate_spec.interrupt`). The
command checks everything it can before Spark starts:
the spec file (syntax and fields, named as in the file), the options (named
as typed: ``--ops``, not ``operations_per_workload``), the implementation
names, the master URL, and ``--out``.

The ``cowstate`` program (:mod:`cowstate.cli`) imports nothing of the
specification: it finds :func:`main` as the command ``check`` this package
registers under the entry point group ``cowstate.commands``
(``pyproject.toml``) and calls it with the arguments, ``check`` first.
``cowstate savepoint inspect DIR`` belongs to :mod:`cowstate.cli`; it is
accepted here too (handed to that program's main: the specification imports
the library, never the other way), so ``scripts/cowstate_check.py`` under
spark-submit takes both.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import sys
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cowstate.cli import (
    EXIT_DIVERGENCE,
    EXIT_OK,
    EXIT_STATUSES,
    OneLineParser,
    guarded,
    print_output,
    raised_by_interrupt,
)
from cowstate.cli import main as cowstate_main
from cowstate.errors import InvalidArgumentError
from cowstate_spec import interrupt
from cowstate_spec.spark_env import (
    IN_PROCESS,
    CheckEnvironmentError,
    stop_session,
    validate_master,
)
from cowstate_spec.workloads import PRESETS, SpecFileError, WorkloadSpec, preset

__all__ = [
    "check_parser",
    "describe_validation_error",
    "format_summary",
    "implementation_names",
    "main",
]

PROG = "cowstate check"
#: Spec fields the command line overrides, by the option that sets them.
OPTIONS = {
    "workloads": "--workloads",
    "operations_per_workload": "--ops",
    "base_seed": "--seed",
    "implementations": "--implementation",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``cowstate check ...`` (``argv`` starts with ``check``); the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["savepoint"]:
        return cowstate_main(args)
    if args[:1] == ["check"]:
        args = args[1:]
    previous = signal.getsignal(signal.SIGINT)
    interrupt.reset()
    interrupt.install()  # Ctrl-C whenever it comes: cowstate_spec.interrupt
    try:
        return guarded(PROG, lambda: _interruptible(args), environment=(CheckEnvironmentError,))
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)


def check_parser() -> OneLineParser:
    """The parser of ``cowstate check`` (its help lists presets, implementations
    and exit statuses)."""
    parser = OneLineParser(
        prog=PROG,
        description=textwrap.fill(
            "Run random workloads against cowstate's implementations and the reference model "
            "side by side, on Spark or in this process; report every divergence, minimized to "
            "a replayable trace and a pytest regression."
        ),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", type=Path, metavar="FILE", help="workload spec (.json, .yaml)")
    source.add_argument("--preset", metavar="NAME", help="a shipped spec (listed below)")
    parser.add_argument("--workloads", type=_at_least(1), metavar="N", help="number of workloads")
    parser.add_argument("--ops", type=_at_least(1), metavar="M", help="operations per workload")
    parser.add_argument("--seed", type=_at_least(0), metavar="S", help="base seed")
    parser.add_argument(
        "--implementation",
        action="append",
        dest="implementations",
        metavar="NAME",
        help="an implementation to check (repeatable; replaces the spec's list)",
    )
    parser.add_argument(
        "--master",
        default="local[*]",
        metavar="URL",
        help="Spark master URL, or 'in-process' for no Spark (default: local[*]); "
        "ignored under spark-submit",
    )
    parser.add_argument(
        "--partitions",
        type=_at_least(1),
        metavar="P",
        help="Spark partitions (default: 4 per core)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.pyspark.python=/opt/py/bin/python (repeatable)",
    )
    parser.add_argument(
        "--executor-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for a standalone cluster's first executor (default: 120)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("out/check"), metavar="DIR", help="default: out/check"
    )
    parser.add_argument(
        "--regressions-dir",
        type=Path,
        metavar="DIR",
        help="where pytest regressions go (default: tests/regressions if it exists, "
        "else OUT/regressions)",
    )
    parser.add_argument(
        "--max-minimized",
        type=_at_least(0),
        default=10,
        metavar="N",
        help="minimize at most N divergences per implementation (default: 10)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress display")
    return parser


def implementation_names() -> list[str]:
    """Every name ``--implementation`` accepts."""
    from cowstate_spec.bad_implementations import BUGS, ITERATION_BUGS
    from cowstate_spec.implementations import IMPLEMENTATIONS

    bugs = (*BUGS, *ITERATION_BUGS)
    return [i.name for i in IMPLEMENTATIONS] + [f"bad-{bug.name}" for bug in bugs]


def describe_validation_error(exc: ValidationError, where: str) -> str:
    """One line for pydantic's errors: each field (or the option that set it,
    see :data:`OPTIONS`), what was expected and what came; no URLs."""
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error["loc"])
        field = str(error["loc"][0]) if error["loc"] else ""
        name = OPTIONS.get(field, location) if where == "options" else location
        parts.append(f"{name}: {_expected(error)}" if name else _expected(error))
    prefix = "" if where == "options" else f"{where}: "
    return prefix + "; ".join(parts)


# ------------------------------------------------------------------ the command


def _interruptible(argv: list[str]) -> int:
    """:func:`_check`; interrupted, it stops Spark before the one line is
    printed. What fails while an interrupt is pending (a cancelled job, a
    call to an ended JVM) or is raised from one is the interrupt
    (cowstate_spec.interrupt, rule 4)."""
    try:
        return _check(argv)
    except KeyboardInterrupt:
        stop_session()
        raise
    except Exception as exc:
        if not (interrupt.pending() or raised_by_interrupt(exc)):
            raise
        stopped = interrupt.take()  # before stopping: nothing interrupts the stop
        stop_session()
        raise stopped from None


def _check(argv: list[str]) -> int:
    parser = check_parser()
    args = parser.parse_args(argv)
    spec = _spec(args)
    master = validate_master(args.master)
    conf = _conf(args.conf)
    if args.executor_timeout <= 0:
        raise InvalidArgumentError(
            f"--executor-timeout: expected seconds > 0, got {args.executor_timeout}"
        )
    if master == IN_PROCESS and (args.partitions is not None or conf):
        raise InvalidArgumentError(
            "--partitions and --conf are Spark settings, expected neither with --master in-process"
        )
    from cowstate_spec.spark_job import prepare_output, run_check

    prepare_output(args.out)
    regressions = args.regressions_dir or (
        Path("tests/regressions")
        if Path("tests/regressions").is_dir()
        else args.out / "regressions"
    )
    if regressions.exists() and not regressions.is_dir():
        raise InvalidArgumentError(
            f"--regressions-dir {str(regressions)!r} is a file, expected a directory"
        )
    report = run_check(
        spec,
        args.out,
        master=master,
        partitions=args.partitions,
        regressions_dir=regressions,
        progress=not args.no_progress,
        max_minimized=args.max_minimized,
        conf=conf,
        executor_timeout=args.executor_timeout,
    )
    print_output(format_summary(report.summary, args.out))
    return EXIT_DIVERGENCE if report.diverged else EXIT_OK


def _spec(args: argparse.Namespace) -> WorkloadSpec:
    """The spec of ``--spec``/``--preset`` with the options applied; every
    problem as InvalidArgumentError naming the file's field or the option."""
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise InvalidArgumentError(
                f"--preset {args.preset!r}: expected one of {', '.join(sorted(PRESETS))}"
            )
        spec = preset(args.preset)
    else:
        try:
            spec = WorkloadSpec.load(args.spec)
        except SpecFileError as exc:
            raise InvalidArgumentError(f"--spec {str(args.spec)!r} {exc.problem}") from None
        except ValidationError as exc:
            raise InvalidArgumentError(
                describe_validation_error(exc, f"--spec {str(args.spec)!r}")
            ) from None
    overrides: dict[str, Any] = {}
    if args.workloads is not None:
        overrides["workloads"] = args.workloads
    if args.ops is not None:
        overrides["operations_per_workload"] = args.ops
    if args.seed is not None:
        overrides["base_seed"] = args.seed
    if args.implementations:
        from cowstate_spec.conformance import is_external_name

        known = implementation_names()
        unknown = [
            name
            for name in args.implementations
            if name not in known and not is_external_name(name)
        ]
        if unknown:
            raise InvalidArgumentError(
                f"--implementation {unknown[0]!r}: expected one of {', '.join(known)}, "
                "or your own: package.module:factory, process:COMMAND, cmap-process, flink-java"
            )
        overrides["implementations"] = args.implementations
    try:
        return WorkloadSpec.model_validate({**spec.model_dump(), **overrides})
    except ValidationError as exc:
        raise InvalidArgumentError(describe_validation_error(exc, "options")) from None


def _conf(pairs: list[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise InvalidArgumentError(f"--conf {pair!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return conf


def _at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def _expected(error: Any) -> str:
    """What a pydantic error says was expected, and what came."""
    kind, context, got = error["type"], error.get("ctx", {}), error.get("input")
    bounds = {
        "greater_than_equal": ">=",
        "greater_than": ">",
        "less_than_equal": "<=",
        "less_than": "<",
    }
    if kind in bounds:
        limit = next(iter(context.values()))
        return f"expected a number {bounds[kind]} {limit}, got {got!r}"
    if kind == "extra_forbidden":
        return "not a spec field (expected one of " + ", ".join(WorkloadSpec.model_fields) + ")"
    if kind == "missing":
        return "expected a value, got none"
    if kind == "literal_error":
        return f"expected {context.get('expected')}, got {got!r}"
    if kind in ("model_type", "dict_type"):
        return f"expected a mapping of spec fields, got {type(got).__name__} {got!r}"
    if kind == "value_error":
        return str(error["msg"]).removeprefix("Value error, ")
    message = str(error["msg"])
    return (
        f"expected {message[0].lower()}{message[1:]}".replace(
            "expected input should be", "expected"
        )
        + f", got {got!r}"
    )


_YOUR_OWN = (
    "your own: package.module:factory (a Python map), process:'COMMAND' (a map in any "
    "language speaking docs/protocol.md; {python} is this Python), cmap-process (the C map "
    "behind the protocol), flink-java (Flink's CopyOnWriteStateMap: make flink-adapter)"
)


def _epilog() -> str:
    presets = "\n".join(
        f"  {name:<24} {spec.workloads:,} workloads x {spec.operations_per_workload:,} ops"
        for name, spec in sorted(PRESETS.items())
    )
    names = implementation_names()
    good = [n for n in names if not n.startswith("bad-")]
    bad = [n for n in names if n.startswith("bad-")]
    statuses = "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_STATUSES.items())
    wrap = functools.partial(
        textwrap.fill,
        initial_indent="  ",
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    return (
        f"presets:\n{presets}\n\n"
        f"implementations (--implementation):\n{wrap(', '.join(good))}\n"
        f"{wrap('planted bugs the check must catch: ' + ', '.join(bad))}\n"
        f"{wrap(_YOUR_OWN)}\n\n"
        f"exit status:\n{statuses}\n\n"
        "examples:\n"
        "  cowstate check --preset smoke\n"
        "  cowstate check --preset collisions --master in-process --workloads 20\n"
        "  cowstate check --spec my.yaml --master spark://HOST:7077 --out /shared/out"
    )


# ------------------------------------------------------------------ the report


def format_summary(summary: dict[str, Any], out: Path) -> str:
    """The console report: the run's figures, then each minimized divergence
    as its trace (never the full expected state)."""
    cores = summary["cores"]
    lines = [
        f"{PROG}: spec {summary['spec']} on {summary['master']} "
        f"({cores} {'core' if cores == 1 else 'cores'})",
        f"  implementations    : {', '.join(summary['implementations'])}",
        f"  workloads          : {summary['workloads']:,}",
        f"  operations checked : {summary['operations_checked']:,} "
        f"in {summary['elapsed_seconds']:.1f} s",
        f"  ops/s              : {summary['ops_per_second']:,.0f} "
        f"({summary['ops_per_second_per_core']:,.0f} per core)",
        f"  ops/CPU-second     : {summary['ops_per_cpu_second']:,.0f} "
        f"({summary['cpu_seconds']:,.1f} CPU s checking)",
        "  most frequent ops  : "
        + ", ".join(f"{k} {v:,}" for k, v in list(summary["operation_counts"].items())[:6]),
    ]
    lines.extend(_event_lines(summary.get("events", {})))
    for name, skipped in summary.get("skipped_checks", {}).items():
        if skipped:
            lines.append(
                f"  skipped checks     : {name} lacks what they need: {'; '.join(skipped)}"
            )
    divergent = {k: v for k, v in summary["divergent_workloads"].items() if v}
    total = sum(divergent.values())
    detail = ", ".join(f"{name} {count:,}" for name, count in divergent.items())
    lines.append(f"  divergences        : {total:,}" + (f" ({detail})" if detail else ""))
    shown = summary["divergences"][:5]
    for d in shown:
        operation = json.loads(d["operation"])[0] if d["operation"] else "?"
        lines.append(
            f"    - {d['implementation']} workload {d['workload']}, op {d['divergence_at']} "
            f"({operation}); minimized to {d['minimized_operations']} ops:"
        )
        lines.extend(f"        {_call(op)}" for op in d["minimized_trace"])
        lines.append(f"      expected {_clip(d['minimized_expected'])}")
        lines.append(f"      got      {_clip(d['minimized_actual'])}")
        lines.append(f"      trace    {d['trace']}")
    if len(summary["divergences"]) > len(shown):
        lines.append(
            f"    ... {len(summary['divergences']) - len(shown)} more in {out}/summary.json"
        )
    files = f"{summary['records']}, summary.json" + (", traces/" if total else "")
    lines.append(f"  output             : {out}/ ({files})")
    return "\n".join(lines)


def _event_lines(events: dict[str, int]) -> list[str]:
    """The rare paths the run met: snapshots a rehash ran under, interrupted
    iterations (see cowstate_spec.differential)."""
    from cowstate_spec import differential as d

    lines = []
    if events.get(d.SNAPSHOT_IN_REHASH):
        lines.append(
            f"  snapshots in rehash: {events[d.SNAPSHOT_IN_REHASH]:,} "
            f"(r > 0: {events.get(d.SNAPSHOT_IN_REHASH_STARTED, 0):,}, "
            f"r >= 3L/4: {events.get(d.SNAPSHOT_IN_REHASH_LATE, 0):,})"
        )
    fast, went_on = events.get(d.FAILED_FAST, 0), events.get(d.WENT_ON, 0)
    if fast or went_on:
        lines.append(f"  fail-fast checks   : {fast:,} failed fast, {went_on:,} went on")
    return lines


def _call(op: list[Any]) -> str:
    name, *args = op
    return f"{name}({', '.join(json.dumps(a) for a in args)})"


def _clip(text: str | None, width: int = 160) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= width else line[: width - 5] + " ..."


if __name__ == "__main__":
    raise SystemExit(main())
