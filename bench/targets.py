"""One table of an issue's benchmark targets, from the benchmarks' result files.

Run (``make bench`` runs it last, for issue 28)::

    .venv/bin/python bench/targets.py --issue 28
    .venv/bin/python bench/targets.py --issue 28 --results bench/results

Every benchmark writes its targets into its JSON result (``targets``: name,
ratio, limit, the measured value, ``met``, and an explanation naming the
issue). This script reads every ``*.json`` of ``--results`` except the
``--quick`` ones (``*_quick.json``), keeps the targets whose explanation
names the issue, and prints them side by side: the target, the entries it was
measured at, the measured ratio against its limit, MET or NOT MET, and the
file it came from -- so the figures measured at 1M and 10M by different runs
read as one table. A result file that is missing prints nothing for it: the
table says which files it read and when each run finished. Nothing is
measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Row:
    name: str
    entries: int | None
    value: float
    op: str
    limit: float
    met: bool
    source: str


def rows_of(path: Path, issue: str) -> list[Row]:
    """The targets of ``path`` whose explanation names ``issue``."""
    document = json.loads(path.read_text())
    entries = _entries_of(document)
    rows = []
    for target in document.get("targets", []):
        if not str(target.get("explanation", "")).startswith(f"issue {issue}"):
            continue
        rows.append(
            Row(
                name=str(target["name"]),
                entries=entries,
                value=float(target["value"]),
                op=str(target["op"]),
                limit=float(target["limit"]),
                met=bool(target["met"]),
                source=path.name,
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    width = max([len(r.name) for r in rows] + [6])
    lines = [
        f"{'target':<{width}}  {'entries':>10}  {'measured':>9}  {'limit':>8}  {'result':7}  file",
        "-" * (width + 60),
    ]
    for r in rows:
        entries = f"{r.entries:,}" if r.entries else "?"
        verdict = "MET" if r.met else "NOT MET"
        lines.append(
            f"{r.name:<{width}}  {entries:>10}  {r.value:>8.2f}x  {r.op} {r.limit:<5g}  "
            f"{verdict:7}  {r.source}"
        )
    met = sum(r.met for r in rows)
    lines.append(f"\n{met} of {len(rows)} targets met")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--issue", required=True, help="the issue number, e.g. 28")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results directory")
    args = parser.parse_args(argv)
    files = sorted(p for p in args.results.glob("*.json") if not p.stem.endswith("_quick"))
    rows = [row for path in files for row in rows_of(path, args.issue)]
    print(f"Issue {args.issue}: the benchmark targets, from {args.results}")
    for path in files:
        if any(r.source == path.name for r in rows):
            finished = json.loads(path.read_text()).get("finished_at", "?")
            print(f"  {path.name}: finished {finished}")
    if not rows:
        print(f"no result file in {args.results} has a target of issue {args.issue}")
        return 1
    print()
    print(table(sorted(rows, key=lambda r: (_benchmark_of(r.source), r.entries or 0))))
    return 0


def _benchmark_of(source: str) -> str:
    """The benchmark of a result file (``snapshot_codec_10m.json``: ``snapshot_codec``)."""
    return source.removesuffix(".json").removesuffix("_10m")


def _entries_of(document: dict[str, Any]) -> int | None:
    config = document.get("config")
    for found in (
        config.get("entries") if isinstance(config, dict) else None,
        document.get("entries"),
    ):
        if isinstance(found, int):
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
