"""Shared helpers for the cowstate benchmarks.

Every benchmark in ``bench/`` follows one method, implemented here:

* a *run* is a callable that does its own untimed setup, times exactly the
  section it wants with :func:`time.perf_counter_ns`, does its own untimed
  teardown, and returns the elapsed nanoseconds of the timed section;
* :func:`measure` calls a run ``warmup`` times (discarded), then ``repeats``
  times, optionally after a full ``gc.collect()`` before each call so that
  every repetition starts with empty young generations and no pending
  full collection, and keeps every repetition's value;
  :func:`measure_interleaved` does the same for several competitors
  round-robin (repetition ``i`` of all before repetition ``i + 1`` of any);
* the number reported is the **median** of the repetitions (min and max are
  kept in the JSON output);
* all competitors are measured side by side in one process, on the same
  keys, so that their numbers can be divided by one another.

A :class:`Result` is one table row (one metric, one value per competitor),
a :class:`Target` is a ratio between two cells with a limit, and
:func:`format_table` / :func:`format_targets` print them. :func:`write_json`
stores rows, targets and :func:`machine_info` for later comparison.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Competitor",
    "Result",
    "Sample",
    "Target",
    "TargetOutcome",
    "check_targets",
    "format_table",
    "format_targets",
    "machine_info",
    "measure",
    "measure_interleaved",
    "paired_ratio",
    "percentile_from_top",
    "time_ns",
    "write_json",
]

Run = Callable[[], int]


@dataclass(frozen=True)
class Sample:
    """The values of one measurement, one per repetition, in the row's unit."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    def scaled(self, factor: float) -> Sample:
        """The same sample with every value multiplied by ``factor``."""
        return Sample(tuple(v * factor for v in self.values))

    @classmethod
    def single(cls, value: float) -> Sample:
        return cls((value,))


def time_ns(fn: Callable[[], object]) -> int:
    """Nanoseconds one call of ``fn`` takes (a run with no setup)."""
    clock = time.perf_counter_ns
    t0 = clock()
    fn()
    return clock() - t0


def _call(run: Run, collect: bool, gc_enabled: bool) -> int:
    if collect:
        gc.collect()
    if gc_enabled:
        return run()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return run()
    finally:
        if was_enabled:
            gc.enable()


def measure(
    run: Run, *, warmup: int = 1, repeats: int = 5, collect: bool = True, gc_enabled: bool = True
) -> Sample:
    """Call ``run`` ``warmup`` times (discarded) then ``repeats`` times.

    ``run`` returns the elapsed nanoseconds of its timed section. With
    ``collect`` a full ``gc.collect()`` precedes every call (untimed). The
    garbage collector stays enabled during the call unless ``gc_enabled`` is
    false (then it is disabled for the whole call, as :mod:`timeit` does).
    """
    return measure_interleaved(
        {"": run}, warmup=warmup, repeats=repeats, collect=collect, gc_enabled=gc_enabled
    )[""]


def measure_interleaved(
    runs: Mapping[str, Run],
    *,
    warmup: int = 1,
    repeats: int = 5,
    collect: bool = True,
    gc_enabled: bool = True,
) -> dict[str, Sample]:
    """Like :func:`measure` for several competitors at once, round-robin.

    Repetition ``i`` of every competitor runs before repetition ``i + 1`` of
    any, so slow drift of the machine (other processes, thermal state) is
    spread over all competitors instead of landing on whichever ran last.
    """
    if repeats < 1:
        raise ValueError(f"expected repeats >= 1, got {repeats}")
    values: dict[str, list[float]] = {key: [] for key in runs}
    for i in range(warmup + repeats):
        for key, run in runs.items():
            elapsed = _call(run, collect, gc_enabled)
            if i >= warmup:
                values[key].append(float(elapsed))
    return {key: Sample(tuple(v)) for key, v in values.items()}


def percentile_from_top(top_desc: Sequence[int], n: int, q: float) -> int:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of ``n`` values, given
    at least the ``n - ceil(q*n) + 1`` largest of them in descending order
    (e.g. from :func:`heapq.nlargest`)."""
    rank = max(1, math.ceil(round(q * n, 9)))  # nearest rank: ceil(q * n)
    idx = n - rank
    if idx >= len(top_desc):
        raise ValueError(f"need the {idx + 1} largest values, got {len(top_desc)}")
    return top_desc[idx]


@dataclass(frozen=True)
class Competitor:
    """A column: ``key`` in code and JSON, ``label`` in the printed table."""

    key: str
    label: str


@dataclass
class Result:
    """One table row: a metric measured for some of the competitors.

    ``paired`` marks a row measured round-robin (:func:`measure_interleaved`):
    repetition ``i`` of two competitors ran back to back, so their ratio can
    be taken per round. A competitor without a value prints as ``note_missing`` (e.g. ``=dict``
    when the cell would repeat another column's identical run).
    """

    metric: str
    label: str
    unit: str
    samples: dict[str, Sample] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    paired: bool = False
    note: str = ""

    def set(self, competitor: str, sample: Sample) -> None:
        self.samples[competitor] = sample

    def value(self, competitor: str) -> float | None:
        sample = self.samples.get(competitor)
        return None if sample is None else sample.median

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "label": self.label,
            "unit": self.unit,
            "note": self.note,
            "paired": self.paired,
            "median": {k: s.median for k, s in self.samples.items()},
            "min": {k: s.min for k, s in self.samples.items()},
            "max": {k: s.max for k, s in self.samples.items()},
            "repetitions": {k: list(s.values) for k, s in self.samples.items()},
            "missing": dict(self.missing),
        }


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 100_000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_table(
    results: Iterable[Result],
    competitors: Sequence[Competitor],
    *,
    label_width: int | None = None,
    col_width: int = 14,
) -> str:
    """A fixed-width table: one row per result, one column per competitor."""
    results = list(results)
    if label_width is None:
        label_width = max([len("metric"), *(len(f"{r.label} [{r.unit}]") for r in results)]) + 1
    header = "metric".ljust(label_width) + "".join(c.label.rjust(col_width) for c in competitors)
    lines = [header, "-" * len(header)]
    for r in results:
        label = f"{r.label} [{r.unit}]"
        cells = []
        for c in competitors:
            v = r.value(c.key)
            cells.append((r.missing.get(c.key, "-") if v is None else _fmt(v)).rjust(col_width))
        lines.append(label[:label_width].ljust(label_width) + "".join(cells))
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    """``results[metric][numerator] / results[metric][denominator] <op> limit``.

    With ``denominator=None`` the target is absolute: the cell
    ``results[metric][numerator]`` itself, in the row's unit, against ``limit``.
    """

    name: str
    metric: str
    numerator: str
    denominator: str | None
    op: Literal["<=", ">="]
    limit: float
    explanation: str = ""


@dataclass(frozen=True)
class TargetOutcome:
    """``ratio`` is what the limit is checked against: the median of the
    per-round ratios for a paired row, else the ratio of the medians (which is
    always kept in ``ratio_of_medians``)."""

    target: Target
    numerator_value: float | None
    denominator_value: float | None
    ratio: float | None
    ratio_of_medians: float | None
    paired: bool
    met: bool
    unit: str = ""

    def to_json(self) -> dict[str, Any]:
        t = self.target
        return {
            "name": t.name,
            "metric": t.metric,
            "ratio": t.numerator if t.denominator is None else f"{t.numerator} / {t.denominator}",
            "unit": self.unit,
            "op": t.op,
            "limit": t.limit,
            "numerator_value": self.numerator_value,
            "denominator_value": self.denominator_value,
            "value": self.ratio,
            "value_is_median_of_paired_ratios": self.paired,
            "ratio_of_medians": self.ratio_of_medians,
            "met": self.met,
            "explanation": t.explanation,
        }


def paired_ratio(num: Sample, den: Sample) -> float | None:
    """Median of ``num[i] / den[i]`` over rounds, or None if not pairable."""
    if len(num.values) != len(den.values) or any(v == 0 for v in den.values):
        return None
    return statistics.median(a / b for a, b in zip(num.values, den.values, strict=True))


def check_targets(targets: Iterable[Target], results: Iterable[Result]) -> list[TargetOutcome]:
    """Evaluate each target (see :class:`TargetOutcome`); a missing or zero
    cell is NOT MET. An absolute target (no denominator) checks the cell's median."""
    by_metric = {r.metric: r for r in results}
    outcomes = []
    for t in targets:
        row = by_metric.get(t.metric)
        unit = "" if row is None else row.unit
        num_s = None if row is None else row.samples.get(t.numerator)
        if t.denominator is None:
            value = None if num_s is None else num_s.median
            met = value is not None and (value <= t.limit if t.op == "<=" else value >= t.limit)
            outcomes.append(TargetOutcome(t, value, None, value, value, False, met, unit))
            continue
        den_s = None if row is None else row.samples.get(t.denominator)
        num = None if num_s is None else num_s.median
        den = None if den_s is None else den_s.median
        of_medians = None if num is None or den is None or den == 0 else num / den
        paired = None
        if row is not None and row.paired and num_s is not None and den_s is not None:
            paired = paired_ratio(num_s, den_s)
        ratio = paired if paired is not None else of_medians
        met = ratio is not None and (ratio <= t.limit if t.op == "<=" else ratio >= t.limit)
        outcomes.append(
            TargetOutcome(t, num, den, ratio, of_medians, paired is not None, met, unit)
        )
    return outcomes


def _fmt_limit(limit: float) -> str:
    if 0 < limit < 1:
        return f"1/{1 / limit:g}"
    return f"{limit:g}"


def format_targets(
    outcomes: Iterable[TargetOutcome],
    *,
    values: bool = False,
    labels: Mapping[str, str] | None = None,
    missing: Mapping[str, str] | None = None,
) -> str:
    """One line per target: ``[    MET]`` or ``[NOT MET]``, the ratio and the limit.

    With ``values`` the two medians (and the row's unit) are printed too,
    competitors named by ``labels``; ``missing`` gives the reason printed for
    a competitor without a value (e.g. "not built").
    """
    labels = labels or {}
    missing = missing or {}

    def cell(key: str, value: float | None, unit: str) -> str:
        name = labels.get(key, key)
        if value is None:
            return f"{name} {missing.get(key, 'n/a')}"
        return f"{name} {_fmt(value)} {unit}".rstrip()

    lines = []
    for o in outcomes:
        t = o.target
        status = "MET" if o.met else "NOT MET"
        if t.denominator is None:
            lines.append(
                f"  [{status:>7}] {t.name}: {cell(t.numerator, o.ratio, o.unit)}, "
                f"target {t.op} {_fmt(t.limit)} {o.unit}".rstrip()
            )
            continue
        ratio = "n/a" if o.ratio is None else f"{o.ratio:.4g}"
        inverse = (
            "" if o.ratio is None or o.ratio == 0 or o.ratio >= 1 else (f" (= 1/{1 / o.ratio:.3g})")
        )
        how = ""
        if o.paired and o.ratio_of_medians is not None:
            how = f" [median of per-round ratios; ratio of medians {o.ratio_of_medians:.4g}]"
        numbers = ""
        if values:
            numbers = (
                f" ({cell(t.numerator, o.numerator_value, o.unit)} / "
                f"{cell(t.denominator, o.denominator_value, o.unit)})"
            )
        lines.append(
            f"  [{status:>7}] {t.name}: {t.numerator}/{t.denominator} = "
            f"{ratio}{inverse}{numbers}, target {t.op} {_fmt_limit(t.limit)}{how}"
        )
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    """Interpreter and host facts stored next to every result."""
    info: dict[str, Any] = {
        "python_version": sys.version,
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "gc_threshold": list(gc.get_threshold()),
    }
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(ValueError, OSError, AttributeError):
        info["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return info


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON, creating the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
