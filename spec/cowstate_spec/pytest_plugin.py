"""The pytest plug-in: check your own map against cowstate's model in three lines.

Registered under the ``pytest11`` entry point (``cowstate``), so installing
``cowstate[dev]`` is enough; ``-p no:cowstate`` turns it off. It adds the
``cowstate_conformance`` fixture::

    from mymap import MyMap
    def test_my_map(cowstate_conformance):
        cowstate_conformance.check(MyMap)

``check(factory, capabilities=None, **options)`` runs the state machine of
:func:`cowstate_spec.conformance.machine_for` under the current Hypothesis
settings (``max_examples`` to override) and then the differential runner
over the first ``workloads`` workloads of the ``tiny`` preset
(:func:`cowstate_spec.conformance.check_differential`). A disagreement fails
the test with the replayable steps: Hypothesis' ``state.put(...)`` lines, or
the minimized operation list. The checks skipped for what the implementation
lacks (its :class:`~cowstate_spec.implementations.Capabilities`) are listed
in the terminal summary, under "cowstate conformance".

This module imports nothing heavy at load: pytest loads it in every session.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["Conformance", "cowstate_conformance"]

_SKIPPED: pytest.StashKey[list[tuple[str, list[str]]]] = pytest.StashKey()


class Conformance:
    """What the ``cowstate_conformance`` fixture gives a test."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config

    def check(
        self,
        factory: Any,
        capabilities: Any = None,
        *,
        max_examples: int | None = None,
        workloads: int = 8,
        shrink: bool = True,
        **options: Any,
    ) -> list[str]:
        """Check ``factory`` (or an Implementation) by the state machine and the
        differential runner; the checks skipped for what it lacks. ``shrink``
        false reports a failing step list as found (shrinking a long one can
        take a minute)."""
        from hypothesis import HealthCheck, Phase, settings
        from hypothesis.stateful import run_state_machine_as_test

        from cowstate_spec.conformance import _implementation_of, check_differential, machine_for

        target = _implementation_of(factory, capabilities, options)
        machine = machine_for(target)
        skipped: list[str] = machine.skipped_checks
        self._config.stash.setdefault(_SKIPPED, []).append((target.name, skipped))
        current = settings()
        # The spec's strategies are not the user's to speed up; its steps vary in cost.
        quiet = (*current.suppress_health_check, HealthCheck.too_slow)
        run_state_machine_as_test(
            machine,
            settings=settings(
                current,
                max_examples=max_examples or current.max_examples,
                deadline=None,
                suppress_health_check=quiet,
                # "explain" traces the spec's own lines: slow, and nothing the user reads
                phases=[
                    phase
                    for phase in current.phases
                    if phase is not Phase.explain and (shrink or phase is not Phase.shrink)
                ],
            ),
        )
        check_differential(target, workloads=workloads)
        return skipped

    def machine(self, factory: Any, capabilities: Any = None, **options: Any) -> Any:
        """The state machine class alone (:func:`cowstate_spec.conformance.machine_for`)."""
        from cowstate_spec.conformance import machine_for

        return machine_for(factory, capabilities, **options)


@pytest.fixture
def cowstate_conformance(request: pytest.FixtureRequest) -> Conformance:
    """Checks a map (or table) factory against cowstate's reference model."""
    return Conformance(request.config)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    checked = config.stash.get(_SKIPPED, [])
    if not checked:
        return
    terminalreporter.section("cowstate conformance")
    for name, skipped in checked:
        if skipped:
            terminalreporter.write_line(f"{name}: skipped, for what it lacks: {'; '.join(skipped)}")
        else:
            terminalreporter.write_line(f"{name}: every check ran")
