"""Broken arithmetic the symbolic checks must catch (``tests/test_symbolic.py``).

Like :mod:`cowstate_spec.bad_implementations`, each bug is a one-line rewrite
of the real source: :func:`broken_source` returns ``cowstate/arithmetic.py``
with one function body changed and every contract intact, and ``crosshair
check`` must find a counterexample in it. ``bad_snapshot_layout`` drops the
moved high half of the rehash table; ``crosshair diffbehavior`` must tell it
from the plain layout. :data:`KEY_GROUP_BUGS` are one-line rewrites of
``cowstate/key_groups.py`` (``broken_source(bug, key_groups)``) that
``crosshair diffbehavior`` must tell from ``cowstate_model.key_groups``. A
check that finds nothing here would be too weak to trust when it finds
nothing in the real module.

Not here: a wrong shift in ``spread_hash`` (``h >> 15``). CrossHair reasons
poorly about XOR and shifts of unbounded ints and does not refute it within
minutes; ``tests/test_arithmetic.py`` (examples and the plain formulation)
and invariant 1 of the checker catch it instead.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType

import cowstate.arithmetic as real
import cowstate_model.arithmetic as plain
from cowstate_spec.equivalences import _layout_domain

__all__ = ["BUGS", "KEY_GROUP_BUGS", "ArithmeticBug", "bad_snapshot_layout", "broken_source"]


@dataclass(frozen=True)
class ArithmeticBug:
    """Replace ``old`` by ``new`` (exactly one occurrence) in ``function``."""

    function: str
    old: str
    new: str


BUGS = [
    ArithmeticBug(
        "in_rehash_table",
        "return bucket_index(h, capacity) < rehash_index",
        "return bucket_index(h, capacity) <= rehash_index",
    ),
    ArithmeticBug(
        "rehash_destination", "return h & (2 * capacity - 1)", "return h & (capacity - 1)"
    ),
    ArithmeticBug(
        "clamp_capacity",
        "return 1 << (requested - 1).bit_length()",
        "return 1 << requested.bit_length()",
    ),
    ArithmeticBug(
        "threshold_for",
        "return (capacity >> 1) + (capacity >> 2)",
        "return (capacity >> 1) + (capacity >> 3)",
    ),
    ArithmeticBug(
        "highest_required_version",
        "return max(open_versions) if open_versions else 0",
        "return min(open_versions) if open_versions else 0",
    ),
]


#: Bugs of ``cowstate.key_groups`` that ``crosshair diffbehavior`` must tell from
#: the plain function of the same name in ``cowstate_model.key_groups``.
KEY_GROUP_BUGS = [
    ArithmeticBug(
        "murmur_hash", "c = (c << 15 | c >> 17) & _MASK32", "c = (c << 16 | c >> 16) & _MASK32"
    ),
    ArithmeticBug("bit_mix", "x ^= x >> 13", "x ^= x >> 12"),
]


def broken_source(bug: ArithmeticBug, module: ModuleType = real) -> str:
    """The source of ``module`` (default ``cowstate.arithmetic``) with ``bug`` applied."""
    source = inspect.getsource(module)
    if source.count(bug.old) != 1:
        raise ValueError(
            f"bug in {bug.function}: expected exactly one {bug.old!r} in "
            f"{module.__name__}, found {source.count(bug.old)}"
        )
    return source.replace(bug.old, bug.new)


def bad_snapshot_layout(
    primary: list[int], rehash: list[int] | None, r: int, size: int
) -> list[int | None] | None:
    """The compact layout without ``rehash[L:L+r]``, guarded like the real pair."""
    if not _layout_domain(primary, rehash, r, size):
        return None
    if rehash is not None:
        rehash = rehash[: len(primary)] + [0] * len(primary)
    out: list[int | None] = plain.snapshot_layout(primary, rehash, r, size)
    return out
