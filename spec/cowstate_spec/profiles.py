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
- ``crosshair``: the ``hypothesis-crosshair`` backend (CrossHair chooses the
  inputs symbolically instead of at random) on small bounds, for ``make verify``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, Verbosity, settings

PROFILES = ("ci", "dev", "deep", "mutation", "crosshair")


def register_profiles() -> None:
    common = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
    settings.register_profile(
        "ci", common, max_examples=120, stateful_step_count=40, derandomize=True, database=None
    )
    settings.register_profile("dev", common, max_examples=200, stateful_step_count=50)
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
