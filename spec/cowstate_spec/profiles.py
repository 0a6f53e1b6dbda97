"""Hypothesis profiles of the project, loaded explicitly by ``tests/conftest.py``.

``COWSTATE_PROFILE`` picks one (default: ``ci`` when ``CI`` is set, else
``dev``). Loading it explicitly matters: with ``CI=true`` Hypothesis would
otherwise load its own built-in ``ci`` profile.

- ``ci``: derandomized (the same examples every run), no example database,
  bounded so ``make test`` stays well under 10 minutes.
- ``dev``: random seeds and the local example database, moderate size.
- ``deep``: many more and longer runs, by hand (``make deep``).
- ``mutation``: fixed seeds, no shrinking, no database, fewer examples: the
  killer suite of ``make mutate`` (a mutant is killed or not, reproducibly).
- ``sanitize``: ``ci`` with a quarter of its examples (30), for ``make
  sanitize``'s codec and writer tests (the C code under ASan/UBSan, where
  every step costs two to three times as much): measured with gcov
  (2026-11-28), ``make sanitize``'s two processes together reach every line
  and every branch of ``_codec.c``, ``_codecmodule.c``, ``_writer.c`` and the
  C map's files under this profile that they reached with 60 examples (the
  long sections of ``encode_section``, which only some of the 60 examples
  made, are tests of their own: ``tests/test_snapshot_io.py``, "long
  section"); ``make test`` runs the same tests unsanitized with ``ci``'s
  examples.
- ``sanitize-maps``: ``ci`` with an eighth of its examples (15), for ``make
  sanitize``'s map suites (the map machines over the C map, the C-map tests):
  measured with gcov (2026-11-28), they reach every line and every branch of
  ``_cmap.c``, ``_cmap_probe.c``, ``_keygroups.c`` and ``_void.c`` under this
  profile that they reach with 60 examples (among them the lines of
  ``_cmap.c`` and the probe that only the map machines reach), and ``make
  test`` runs the same machines unsanitized with ``ci``'s examples.
- ``crosshair``: the ``hypothesis-crosshair`` backend (CrossHair chooses the
  inputs symbolically instead of at random) on small bounds, for ``make verify``.

``COWSTATE_STRENGTH`` (:func:`strength`) says how much the spec-strength suites
run -- ``tests/test_spec_catches_every_class.py``, ``tests/test_user_code_errors.py``
and ``tests/test_symbolic.py``, the proof that the machines and CrossHair catch
what they must:

- ``reduced`` (the default, ``make test``): every planted bug is hunted with
  its full budget, as in the full form; each identity control (the machine
  rebuilt around the bug's text replaced by itself) runs as many examples as
  the hunt took to catch its bug (:func:`hunt` counts them), at most the full
  form's; CrossHair refutes every planted arithmetic bug with smaller limits
  (each still twice what the refutation needs, 5/3 for the snapshot layout);
  the hostile machines run over every implementation with half the full
  form's examples.
- ``full`` (``make strength``): the controls with their whole budgets, CrossHair
  with the generous limits, the hostile machines with a quarter of the plain
  machines' examples.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

PROFILES = ("ci", "dev", "deep", "mutation", "crosshair", "sanitize", "sanitize-maps")
STRENGTHS = ("reduced", "full")


def register_profiles() -> None:
    common = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
    settings.register_profile(
        "ci", common, max_examples=120, stateful_step_count=40, derandomize=True, database=None
    )
    settings.register_profile("dev", common, max_examples=200, stateful_step_count=50)
    settings.register_profile(  # ci's runs, a quarter: the codec's C paths all reached (doc)
        "sanitize", common, max_examples=30, stateful_step_count=40, derandomize=True, database=None
    )
    settings.register_profile(  # the map suites' C paths all reached with an eighth (doc)
        "sanitize-maps",
        common,
        max_examples=15,
        stateful_step_count=40,
        derandomize=True,
        database=None,
    )
    settings.register_profile(
        "deep", common, max_examples=4000, stateful_step_count=120, verbosity=Verbosity.normal
    )
    settings.register_profile(
        "mutation",
        common,
        max_examples=60,
        stateful_step_count=40,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
    )
    settings.register_profile(
        "crosshair",
        common,
        backend="crosshair",
        max_examples=40,
        stateful_step_count=12,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def same_examples_everywhere() -> None:
    """Stop Hypothesis from mixing module constants into generation.

    Hypothesis (6.131 and later) draws some values from the literal constants
    of every *local* module in ``sys.modules``. Which modules are loaded
    depends on which tests ran before, so a derandomized test drew different
    examples alone than in the full suite, and a broken map the spec catches
    alone in 25 examples escaped 800 in a full run. With the pool empty, a
    test draws the same examples wherever it runs. (An internal of
    Hypothesis: if it moves, there is nothing to turn off.)
    """
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # pragma: no cover - another layout
        return
    if hasattr(providers, "_get_local_constants"):
        empty = Constants()
        providers._get_local_constants = lambda: empty


def warm_unicode_tables() -> None:
    """Write Hypothesis's tables of Unicode characters (its charmap and the
    UTF-8 codec's intervals, in ``.hypothesis/unicode_data``) if they are not
    on disk yet. A process that draws text computes them when they are
    missing, and on a fresh clone ``make test``'s pytest workers and ``make
    sanitize``'s processes start side by side: each computed them, 6 CPU
    seconds in the plain Python and 19 under ASan (measured 2026-11-28).
    ``make pytest`` and ``make sanitize`` call this first (about 0.3 s once
    written). (An internal of Hypothesis: if it moves, there is nothing to
    write.)"""
    try:
        from hypothesis.internal.charmap import charmap, intervals_from_codec
    except ImportError:  # pragma: no cover - another layout
        return
    charmap()
    intervals_from_codec("utf-8")


def load_profile() -> str:
    """Register the profiles and load the one the environment asks for."""
    same_examples_everywhere()
    register_profiles()
    default = "ci" if os.environ.get("CI") else "dev"
    name = os.environ.get("COWSTATE_PROFILE", default)
    if name not in PROFILES:
        raise ValueError(f"expected COWSTATE_PROFILE in {PROFILES}, got {name!r}")
    settings.load_profile(name)
    return name


def hunt_settings(max_examples: int, stateful_step_count: int) -> settings:
    """Settings of a bug hunt (the ``test_spec_catches_bad_*`` modules): generation
    only (no shrinking, no replay database), derandomized so a catch is the same
    every run, the first failure ends the run."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow],
    )


def strength() -> str:
    """``COWSTATE_STRENGTH``: ``reduced`` (default) or ``full`` (see the module doc)."""
    name = os.environ.get("COWSTATE_STRENGTH", "reduced")
    if name not in STRENGTHS:
        raise ValueError(f"expected COWSTATE_STRENGTH in {STRENGTHS}, got {name!r}")
    return name


def hunt(
    machine: type[RuleBasedStateMachine],
    hunting: settings,
    caught: tuple[type[BaseException], ...],
    check: Callable[[BaseException], Any] = lambda exc: None,
) -> int:
    """Run ``machine`` under ``hunting`` (:func:`hunt_settings`); it must fail with
    one of ``caught`` (``check`` may look closer). Returns how many examples it
    started until then (the failing one is replayed once to report it, so one
    more than it took): a derandomized control of the same machine without the
    bug meets the same first examples (the bug changes nothing before it shows)."""
    started = [0]

    def counting_init(self: RuleBasedStateMachine) -> None:
        started[0] += 1
        machine.__init__(self)

    counted = type(machine.__name__, (machine,), {"__init__": counting_init})
    try:
        run_state_machine_as_test(counted, settings=hunting)
    except caught as exc:
        check(exc)
        return started[0]
    raise AssertionError(
        f"expected {machine.__name__} to fail with {' or '.join(c.__name__ for c in caught)} "
        f"within {hunting.max_examples} examples x {hunting.stateful_step_count} steps, "
        f"it passed {started[0]}"
    )


def control_examples(caught_after: int, full: int) -> int:
    """Examples of an identity control: ``full`` in the full form, else as many
    as its hunt took (:func:`hunt`), at most ``full``."""
    return full if strength() == "full" else min(caught_after, full)
