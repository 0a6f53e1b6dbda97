"""``python -m cowstate_spec.fuzz`` (``make fuzz``): run both fuzzers, print the
classification, write every reproducer, exit 1 on any wrong, partial,
escaped or outside case.

    python -m cowstate_spec.fuzz [--cases-files N] [--cases-dirs M] [--seed S]
        [--classes C ...] [--case SUITE/CLASS/K] [--plant NAME]
        [--examples E] [--reproducers PATH] [--scratch DIR] [--jobs J] [--rocks-share F]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence

from cowstate_spec.fuzz.dir_corruptions import DIR_CLASSES
from cowstate_spec.fuzz.files import FILE_CLASSES
from cowstate_spec.fuzz.planted import PLANTED
from cowstate_spec.fuzz.report import (
    CaseResult,
    bad_results,
    format_table,
    reproducer,
    reproducers,
)
from cowstate_spec.fuzz.runner import Fuzzer

__all__ = ["main"]

DEFAULT_FILE_CASES = 100_000
DEFAULT_DIR_CASES = 10_000


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    plant = PLANTED[args.plant]() if args.plant else contextlib.nullcontext()
    if args.plant and args.jobs > 1:
        print("--plant runs in one process: use --jobs 1", file=sys.stderr)
        return 2
    with Fuzzer(args.seed, args.scratch, args.rocks_share, args.jobs) as fuzzer, plant:
        if args.case:
            result = fuzzer.run_case(args.case)
            print(reproducer(result, args.seed))
            return 1 if bad_results([result]) else 0
        file_classes = [c for c in args.classes if c in FILE_CLASSES] if args.classes else None
        dir_classes = [c for c in args.classes if c in DIR_CLASSES] if args.classes else None
        unknown = set(args.classes or ()) - set(FILE_CLASSES) - set(DIR_CLASSES)
        if unknown:
            print(f"unknown classes: {sorted(unknown)}", file=sys.stderr)
            return 2
        print(
            f"cowstate fuzz: seed {args.seed}, {args.cases_files} snapshot-file cases, "
            f"{args.cases_dirs} checkpoint-directory cases"
            + (f", planted defect {args.plant!r}" if args.plant else "")
            + f" (scratch {fuzzer.scratch}, {args.jobs} job(s), "
            f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED')}, load average {_load()})",
            flush=True,
        )
        results: list[CaseResult] = []
        if args.cases_files and (file_classes is None or file_classes):
            started = time.perf_counter()
            found = fuzzer.run_files(args.cases_files, file_classes, _progress)
            print(f"\nsnapshot files: {len(found)} cases in {time.perf_counter() - started:.1f} s")
            print(format_table("snapshot-file class", found))
            results += found
        if args.cases_dirs and (dir_classes is None or dir_classes):
            started = time.perf_counter()
            found = fuzzer.run_dirs(args.cases_dirs, dir_classes, _progress)
            print(
                f"\ncheckpoint directories: {len(found)} cases in "
                f"{time.perf_counter() - started:.1f} s"
            )
            print(format_table("checkpoint-directory class", found))
            print()
            print(format_table("entry point", found, by="entry"))
            results += found
        bad = bad_results(results)
        os.makedirs(os.path.dirname(os.path.abspath(args.reproducers)), exist_ok=True)
        with open(args.reproducers, "w") as f:
            f.write(reproducers(results, args.seed, None) + "\n")
        print(f"\nload average {_load()}")
        print(
            f"{len(bad)} wrong, partial, escaped or outside cases"
            + (f"; every reproducer in {args.reproducers}" if bad else "")
        )
        if bad:
            print(reproducers(results, args.seed, args.examples))
        return 1 if bad else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cowstate_spec.fuzz",
        description="Corrupt snapshot files and checkpoint directories; classify every outcome.",
    )
    parser.add_argument("--cases-files", type=int, default=DEFAULT_FILE_CASES)
    parser.add_argument("--cases-dirs", type=int, default=DEFAULT_DIR_CASES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--classes", nargs="+", help="only these corruption classes (of either suite)"
    )
    parser.add_argument("--case", help="replay one case, e.g. files/crafted:block-moved/3")
    parser.add_argument("--plant", choices=sorted(PLANTED), help="run with a planted defect")
    parser.add_argument(
        "--examples", type=int, default=3, help="reproducers printed per class and outcome"
    )
    parser.add_argument("--reproducers", default="build/fuzz/reproducers.txt")
    parser.add_argument("--scratch", help="where cases are written (default /dev/shm)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--rocks-share",
        type=float,
        default=0.1,
        help="share of canonical-file cases also restored into RocksDB",
    )
    return parser


def _progress(suite: str, done: int, total: int, seconds: float) -> None:
    print(f"  {suite}: {done}/{total} cases, {seconds:.0f} s", file=sys.stderr, flush=True)


def _load() -> str:
    """The 1-minute load average (timings depend on what else runs)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"
