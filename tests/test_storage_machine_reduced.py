"""A reduced storage machine: the killer of the ``checkpoint`` mutation scope.

The full machine (``test_storage_machine.py``: 4 runs of a quarter of the
profile's examples) costs about 35 s under the ``mutation`` profile, which
every surviving checkpoint mutant would pay. This one runs each backend kind
once, retaining two checkpoints (so subsumption and the shared-state registry
are exercised), with ``COWSTATE_STORAGE_MACHINE_EXAMPLES`` examples (default
5) of 25 steps: the same rules and invariants, fewer and shorter runs.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from cowstate_spec.storage_machine import storage_machine_for

EXAMPLES = int(os.environ.get("COWSTATE_STORAGE_MACHINE_EXAMPLES", "5"))


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_reduced_storage_machine_agrees_with_the_model(kind: str) -> None:
    run_state_machine_as_test(
        storage_machine_for(kind, 2),
        settings=settings(settings(), max_examples=EXAMPLES, stateful_step_count=25),
    )
