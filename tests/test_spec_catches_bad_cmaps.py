"""The specification must catch every deliberately broken C map.

Each bug of cowstate_spec.bad_cmaps is one defect compiled into the C map
(``-DCOWSTATE_BUG=n``). The map state machine, run without shrinking, must
fail on each, with an assertion (a model disagreement or a named invariant);
the real C map under the same settings must pass, so the failures come from
the bugs and not from the way the variants are built and loaded.
"""

import pytest
from hypothesis.stateful import run_state_machine_as_test

from cowstate.maps import c_map_class
from cowstate_spec.bad_cmaps import C_BUGS, CBug, bad_cmap_implementation
from cowstate_spec.implementations import by_name
from cowstate_spec.machine import machine_for
from cowstate_spec.profiles import hunt_settings

pytestmark = pytest.mark.skipif(
    c_map_class() is None,
    reason="the C map is not built (tests/test_implementations.py fails for that)",
)

HUNT = hunt_settings(max_examples=800, stateful_step_count=50)


@pytest.mark.parametrize("bug", C_BUGS, ids=lambda bug: bug.name)
def test_state_machine_catches(bug: CBug) -> None:
    machine = machine_for(bad_cmap_implementation(bug))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=HUNT)


def test_the_real_c_map_passes_the_same_hunt() -> None:
    run_state_machine_as_test(machine_for(by_name("c-map")), settings=HUNT)
