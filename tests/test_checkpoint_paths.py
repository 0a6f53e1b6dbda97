"""Confined paths (``cowstate.checkpoint.paths``): the forms a path in
``_metadata`` may take, rules P1-P4 of the module's docstring.

- P1: an exclusive path has at most 8 components and 255 characters, each
  component a non-empty run of letters, digits, '.', '_', '-' other than
  '.' and '..'; anything else is refused naming an exclusive file;
- P2: a shared path is exactly ``<job id>/shared/<name>``, built and checked;
  an unsafe job id or name, or a path of another form, is refused naming a
  shared file (``UnsafePathError``).

(Resolving paths inside a snapshot's root, P3 and P4, is tested through
whole checkpoints in ``test_restore_trust.py``, "confined paths".) The tests
marked ``kills`` were written to kill mutants of the module (``make mutate
SCOPE=checkpoint``); their comments name the mutants.
"""

from __future__ import annotations

from typing import Any

import pytest

from cowstate.checkpoint import paths
from cowstate.checkpoint.paths import shared_path
from cowstate.errors import UnsafePathError

# --------------------------------------------------------- P1: exclusive paths


@pytest.mark.kills(module="cowstate.checkpoint.paths")
@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "of 1 to 255 characters, got 0"),
        ("../escape", "inside the snapshot"),
        (5, "as a string, got 5"),
    ],
)
def test_an_unsafe_exclusive_path_is_refused_naming_an_exclusive_file(path: Any, why: str) -> None:
    # paths.check_exclusive_path 2, 5, 6 (the role the message names).
    with pytest.raises(UnsafePathError) as caught:
        paths.check_exclusive_path(path)
    assert "path of an exclusive file" in str(caught.value)
    assert why in str(caught.value)


@pytest.mark.kills(module="cowstate.checkpoint.paths")
def test_an_exclusive_path_of_up_to_255_characters_and_8_components_is_taken() -> None:
    # paths._components 3, 5 (the length bound: none, or 255 refused), 10 (8
    # components refused), 15, 16 ("." or ".." taken as a name).
    longest = "/".join(["a" * 31] * 8)  # 255 characters, 8 components
    assert len(longest) == paths.MAX_LENGTH == 255
    assert paths.check_exclusive_path(longest) == longest
    assert paths.check_exclusive_path("a/b/c/d/e/f/g/h") == "a/b/c/d/e/f/g/h"
    assert paths.check_exclusive_path("chk-1/.hidden..name") == "chk-1/.hidden..name"
    refused = {
        "a" * 256: "expected the path of an exclusive file of 1 to 255 characters, got 256",
        "a/b/c/d/e/f/g/h/i": (
            "expected the path of an exclusive file of at most 8 components, got 9 in "
            "'a/b/c/d/e/f/g/h/i'"
        ),
    }
    deep = "/".join(["d" * 12] * 9)  # 116 characters: the message shows the first 80
    refused[deep] = (
        f"expected the path of an exclusive file of at most 8 components, got 9 in {deep[:80]!r}"
    )
    for name in ("a/./b", "a/../b", ".", ".."):
        refused[name] = (
            "expected a relative path of an exclusive file inside the snapshot (letters, "
            "digits, '.', '_', '-' between '/'; no '..', no scheme, not absolute), got "
            f"{name!r}"
        )
    for path, message in refused.items():
        with pytest.raises(UnsafePathError) as caught:
            paths.check_exclusive_path(path)
        assert str(caught.value) == message


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


# paths.check_shared_path 3, 6 (the role the refusal names dropped or mangled).
@pytest.mark.kills(module="cowstate.checkpoint.paths")
def test_an_unsafe_shared_path_is_refused_naming_a_shared_file() -> None:
    with pytest.raises(UnsafePathError) as caught:
        paths.check_shared_path(7)  # type: ignore[arg-type]
    assert str(caught.value) == "expected the path of a shared file as a string, got 7"


# paths.check_shared_path 8, 9, 18 (a path of another form, or whose first
# component is no job id, taken), 19 (the refusal's message dropped).
@pytest.mark.kills(module="cowstate.checkpoint.paths")
@pytest.mark.parametrize(
    "path", ["job/other/x.sst", "job/shared/x/y.sst", "job/x.sst", ".job/shared/x.sst"]
)
def test_a_shared_path_must_be_a_job_ids_shared_file(path: str) -> None:
    with pytest.raises(UnsafePathError) as caught:
        paths.check_shared_path(path)
    assert str(caught.value) == (
        f"expected a shared file path of the form '<job id>/shared/<name>', got {path!r}"
    )
    assert paths.check_shared_path("job-1/shared/x.sst") == "job-1/shared/x.sst"
