"""Confined paths (``cowstate.checkpoint.paths``): the forms a path in
``_metadata`` may take, rules P1-P4 of the module's docstring.

- P2: a shared path is exactly ``<job id>/shared/<name>``, built and checked;
  an unsafe job id or name is refused with an ``UnsafePathError``.

(Resolving paths inside a snapshot's root, P3 and P4, is tested through
whole checkpoints in ``test_restore_trust.py``, "confined paths".) The tests
marked ``kills`` were written to kill mutants of the module (``make mutate
SCOPE=checkpoint``); their comments name the mutants.
"""

from __future__ import annotations

import pytest

from cowstate.checkpoint.paths import shared_path
from cowstate.errors import UnsafePathError

# ------------------------------------------------------------ P2: shared paths


@pytest.mark.kills(module="cowstate.checkpoint.paths")
def test_shared_path_is_job_shared_name() -> None:
    # paths.x_shared_path__mutmut_1: no killer test built a shared path by name.
    assert shared_path("job-1", "a.sst") == "job-1/shared/a.sst"


@pytest.mark.kills(module="cowstate.checkpoint.paths")
@pytest.mark.parametrize(("job_id", "name"), [("..", "a.sst"), ("job", "../a"), ("job", "")])
def test_shared_path_refuses_an_unsafe_job_or_name(job_id: str, name: str) -> None:
    with pytest.raises(UnsafePathError, match="expected"):
        shared_path(job_id, name)
