"""Loads the project's Hypothesis profile (see cowstate_spec.profiles)."""

from cowstate_spec.profiles import load_profile

PROFILE = load_profile()


def pytest_report_header() -> str:
    return f"hypothesis profile: {PROFILE} (set COWSTATE_PROFILE=ci|dev|deep|mutation|crosshair)"
