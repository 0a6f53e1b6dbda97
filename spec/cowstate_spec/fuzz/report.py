"""The fuzzers' report: counts per corruption class and outcome, and a
reproducer for every case that was neither a clean error nor exact."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from cowstate_spec.fuzz.outcomes import ACCEPTABLE, BAD, SEVERITY, Outcome, Verdict

__all__ = ["CaseResult", "bad_results", "format_table", "reproducer", "reproducers"]


@dataclass(frozen=True)
class CaseResult:
    """One case: which (``suite/class/number`` and the seed replay it), what
    was done, and the verdict."""

    suite: str
    cls: str
    number: int
    entry: str
    description: str
    verdict: Verdict

    @property
    def case_id(self) -> str:
        return f"{self.suite}/{self.cls}/{self.number}"


def reproducer(result: CaseResult, seed: int) -> str:
    """The command that replays ``result``, and what it shows."""
    return (
        f"python -m cowstate_spec.fuzz --seed {seed} --case {result.case_id}\n"
        f"    {result.entry}: {result.description}\n"
        f"    -> {result.verdict.outcome}: {result.verdict.detail}"
    )


def bad_results(results: Sequence[CaseResult]) -> list[CaseResult]:
    return [r for r in results if r.verdict.outcome in BAD]


def format_table(title: str, results: Sequence[CaseResult], by: str = "cls") -> str:
    """Cases per class (``by="cls"``) or entry point (``by="entry"``) and outcome."""
    counts: Counter[tuple[str, Outcome]] = Counter()
    rows: dict[str, None] = {}
    for r in results:
        row = r.cls if by == "cls" else r.entry
        rows.setdefault(row, None)
        counts[row, r.verdict.outcome] += 1
    columns = [o for o in SEVERITY[::-1] if any(counts[row, o] for row in rows) or o in BAD]
    width = max([len(title), *(len(row) for row in rows)]) + 2
    head = f"{title:<{width}}{'cases':>7}" + "".join(f"{o.value:>10}" for o in columns)
    lines = [head, "-" * len(head)]
    totals: Counter[Outcome] = Counter()
    for row in rows:
        total = sum(counts[row, o] for o in Outcome)
        cells = "".join(f"{_cell(counts[row, o], o):>10}" for o in columns)
        lines.append(f"{row:<{width}}{total:>7}{cells}")
        for o in Outcome:
            totals[o] += counts[row, o]
    lines.append("-" * len(head))
    cells = "".join(f"{_cell(totals[o], o):>10}" for o in columns)
    lines.append(f"{'total':<{width}}{sum(totals.values()):>7}{cells}")
    return "\n".join(lines)


def reproducers(results: Sequence[CaseResult], seed: int, per_group: int | None) -> str:
    """Reproducers of every bad case, grouped by class and outcome (at most
    ``per_group`` of each group; None: all)."""
    groups: dict[tuple[str, Outcome], list[CaseResult]] = {}
    for r in bad_results(results):
        groups.setdefault((f"{r.suite}/{r.cls}", r.verdict.outcome), []).append(r)
    out = []
    for (cls, outcome), members in sorted(
        groups.items(), key=lambda g: (SEVERITY.index(g[0][1]), g[0][0])
    ):
        shown = members if per_group is None else members[:per_group]
        more = "" if len(shown) == len(members) else f", {len(shown)} shown"
        out.append(f"[{outcome}] {cls}: {len(members)} cases{more}")
        out += ["  " + reproducer(r, seed).replace("\n", "\n  ") for r in shown]
    return "\n".join(out)


def _cell(count: int, outcome: Outcome) -> str:
    if count == 0:
        return "." if outcome in ACCEPTABLE else "0"
    return str(count) if outcome in ACCEPTABLE else f"{count}!"
