"""Every planted restore-check defect of ``cowstate_spec.bad_checks`` -- a
content check that looks at the first entry (subtask, file, column family)
only, a set check that compares sizes -- fails the test written for its check:
run through the planted copy, the test that puts the offending item at every
position (or gives a set the same size and another member) fails at exactly
the positions the defect misses and passes at the others, which shows the
rebound callers pass the test; where a defect has no such position (it fails
everywhere) the identity control (the same callers rebound, the line
unchanged) must pass, so the failure is the defect's.

Each test is the function its own file runs (tests/test_restore_checks.py,
tests/test_restore_trust.py), handed the planted code: a backend class,
``restore_table`` or ``CheckpointCoordinator``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from restore_support import Targets
from test_checkpoint_rules import TWICE_AND_NONE, subtasks_case
from test_restore_checks import (
    POSITIONS,
    Code,
    e1_case,
    e2_case,
    e3_case,
    e4_case,
    e5_case,
    e6_case,
    e6_native_case,
    low_half_in,
    native_case,
)
from test_restore_trust import (
    FILE_POSITIONS,
    SUBTASK_POSITIONS,
    Resealable,
    file_key_groups_case,
    file_states_case,
    m3_case,
    m4_case,
    m4_same_count_case,
    m5_case,
    m6_path_case,
    m8_case,
    m8_same_count_case,
    m9_case,
    n1_same_count_case,
    n2_case,
    n3_same_count_case,
)

from cowstate.errors import CowStateError
from cowstate.snapshot import ccodec
from cowstate_spec.bad_checks import CHECK_BUGS, CheckBug, control, planted, rocksdb_check_bugs
from cowstate_spec.bad_codecs import CODEC_BUGS, CodecBug, build_codec

BUGS = CHECK_BUGS + rocksdb_check_bugs()
#: The C codec's planted reader bugs (its encoder's: tests/test_c_codec.py).
READER_BUGS = [bug for bug in CODEC_BUGS if bug.part == "reader"]
E1_PYTHON_LOOP = next(b for b in BUGS if b.name == "e1-decoding-loop-checks-the-first-entry-only")
SAME_COUNT = ("same count",)


class Fixtures:
    """What the tests of the checks share, made when first asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @functools.cached_property
    def heap_document(self) -> Resealable:
        return Resealable(self.root / "heap-document", "heap")

    @functools.cached_property
    def rocks_document(self) -> Resealable:
        """Restored into heap subtasks: a document a planted check lets through is
        then refused for its format before any file is read (the test fails all
        the same: another error), instead of restored into RocksDB subtasks made
        again for the next position."""
        return Resealable(self.root / "rocks-document", "rocksdb", targets="heap")

    @functools.cached_property
    def low_half(self) -> Any:
        return low_half_in(self.root / "low-half")

    @functools.cached_property
    def targets(self) -> Targets:
        return Targets(self.root / "targets")

    def close(self) -> None:
        for name in ("heap_document", "rocks_document", "targets"):
            if name in vars(self):
                vars(self)[name].close()


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixtures]:
    shared = Fixtures(tmp_path_factory.mktemp("checks"))
    yield shared
    shared.close()


#: ``run(position, tmp, planted code, fixtures)``: one check's test.
Run = Callable[[str, Path, Any, Fixtures], None]


@dataclass(frozen=True)
class Oracle:
    """The test of one check, at each of ``positions``."""

    run: Run
    positions: tuple[str, ...] = POSITIONS


def entries(case: Callable[..., None], *args: Any) -> Run:
    """A snapshot-check test: ``case(*args, position, tmp, code, targets)``."""

    def run(position: str, tmp: Path, code: Any, fx: Fixtures) -> None:
        case(*args, position, tmp, Code.with_planted(code), fx.targets)

    return run


def document(case: Callable[..., None], *args: Any, rocks: bool = False) -> Run:
    """A document-check test: ``case(*args, position, checkpoint, coordinator)``."""

    def run(position: str, tmp: Path, code: Any, fx: Fixtures) -> None:
        case(*args, position, fx.rocks_document if rocks else fx.heap_document, code)

    return run


def same_count(case: Callable[..., None], *, on: str = "") -> Run:
    """A set-check test: ``case(checkpoint or tmp, code)``."""

    def run(position: str, tmp: Path, code: Any, fx: Fixtures) -> None:
        case(getattr(fx, on) if on else tmp, code)

    return run


def native(position: str, tmp: Path, code: Any, fx: Fixtures) -> None:
    native_case("E1", position, tmp, fx.low_half, Code.with_planted(code), fx.targets)


ORACLES: dict[str, Oracle] = {
    "e1-decoding-loop-checks-the-first-entry-only": Oracle(entries(e1_case, "state", "heap")),
    "e1-namespace-check-of-the-first-namespace-only": Oracle(entries(e1_case, "namespace", "heap")),
    "e2-namespace-hash-of-the-first-namespace-only": Oracle(entries(e2_case, "namespace", "heap")),
    "e3-key-group-check-of-the-first-key-only": Oracle(entries(e3_case, "heap")),
    "e4-heap-fill-checks-the-first-two-entries-only": Oracle(entries(e4_case, "heap")),
    "e4-find-duplicate-remembers-the-first-entry-only": Oracle(entries(e4_case, "restore_table")),
    "e5-state-type-of-the-first-state-only": Oracle(entries(e5_case, "heap")),
    "e6-key-type-of-the-first-key-only": Oracle(entries(e6_case, "heap")),
    "e1-row-decoding-checks-the-first-entry-only": Oracle(entries(e1_case, "state", "rocksdb")),
    "e4-rocksdb-compares-with-the-first-key-only": Oracle(entries(e4_case, "rocksdb")),
    "native-copy-checks-the-first-row-only": Oracle(native),
    "e6-native-first-key-of-the-first-column-family-only": Oracle(
        entries(e6_native_case), SUBTASK_POSITIONS
    ),
    "m3-job-id-of-the-first-character-only": Oracle(document(m3_case), SUBTASK_POSITIONS),
    "m4-max-parallelism-of-the-first-subtask-only": Oracle(
        document(m4_case, "max parallelism"), SUBTASK_POSITIONS
    ),
    "m4-range-bounds-of-the-first-subtask-only": Oracle(
        document(m4_case, "range"), SUBTASK_POSITIONS
    ),
    "m4-empty-range-of-the-first-subtask-only": Oracle(
        document(m4_case, "empty range"), SUBTASK_POSITIONS
    ),
    "m4-cover-by-count": Oracle(same_count(m4_same_count_case, on="heap_document"), SAME_COUNT),
    "m5-m7-verify-the-first-subtask-only": Oracle(
        document(m5_case, "checkpoint id"), SUBTASK_POSITIONS
    ),
    "m6-m7-verify-the-first-file-only": Oracle(document(m6_path_case, rocks=True), FILE_POSITIONS),
    "m8-the-first-disowned-file-only": Oracle(document(m8_case, rocks=True), SUBTASK_POSITIONS),
    "m8-disowned-by-count": Oracle(same_count(m8_same_count_case, on="rocks_document"), SAME_COUNT),
    "m9-key-serializers-of-the-first-two-subtasks-only": Oracle(
        document(m9_case, "key serializer"), SUBTASK_POSITIONS
    ),
    "m9-state-schemas-of-the-first-two-subtasks-only": Oracle(
        document(m9_case, "state schema"), SUBTASK_POSITIONS
    ),
    "subtask-ranges-compared-across-an-empty-range": Oracle(
        lambda case, tmp, code, _: subtasks_case(case, tmp, code), tuple(TWICE_AND_NONE)
    ),
    "file-states-by-count": Oracle(same_count(file_states_case), SAME_COUNT),
    "file-key-groups-by-count": Oracle(same_count(file_key_groups_case), SAME_COUNT),
    "n2-first-column-family-only": Oracle(
        lambda p, tmp, code, fx: n2_case(p, tmp, code, fx.targets)
    ),
    "n2-first-key-only": Oracle(lambda p, tmp, code, fx: n2_case(p, tmp, code, fx.targets)),
    "n1-column-families-by-count": Oracle(same_count(n1_same_count_case), SAME_COUNT),
    "n3-native-files-by-count": Oracle(same_count(n3_same_count_case), SAME_COUNT),
}

#: What a test's failure on planted code is: a wrong or missing refusal, a
#: file opened or a target changed, or the raw error of what the check let
#: through (an unhashable key reaching a map). Anything else is the harness's.
FAILURES = (AssertionError, pytest.fail.Exception, CowStateError, TypeError)


def failing_positions(
    check_bug: CheckBug, positions: tuple[str, ...] | frozenset[str], tmp: Path, fx: Fixtures
) -> set[str]:
    """The positions of ``positions`` at which the test of ``check_bug``'s check
    fails on it."""
    oracle = ORACLES[check_bug.name.removeprefix("identity-")]
    # (a check of the Python loop the C codec replaces runs on that loop)
    codec = None if check_bug.python_path else ccodec.CODEC
    with mock.patch.object(ccodec, "CODEC", codec):
        return positions_failing(oracle, positions, tmp, planted(check_bug), fx)


def positions_failing(
    oracle: Oracle, positions: tuple[str, ...] | frozenset[str], tmp: Path, code: Any, fx: Fixtures
) -> set[str]:
    """The positions of ``positions`` at which ``oracle`` fails on ``code``."""
    failed = set()
    for position in positions:
        try:
            oracle.run(position, tmp / position.replace(" ", "-"), code, fx)
        except FAILURES:
            failed.add(position)
    return failed


def test_every_planted_check_has_its_test() -> None:
    assert sorted(ORACLES) == sorted(bug.name for bug in BUGS)
    for bug in BUGS:
        assert bug.escapes <= set(ORACLES[bug.name].positions), bug.name


@pytest.mark.parametrize("check_bug", BUGS, ids=lambda bug: bug.name)
def test_a_sampled_or_counted_check_fails_its_test_where_it_misses(
    check_bug: CheckBug, tmp_path: Path, fixtures: Fixtures
) -> None:
    positions = ORACLES[check_bug.name].positions
    assert failing_positions(check_bug, positions, tmp_path, fixtures) == check_bug.escapes


@pytest.mark.skipif(ccodec.BUILT is None, reason="cowstate._codec is not built")
@pytest.mark.parametrize("bug", READER_BUGS, ids=lambda bug: bug.name)
def test_the_c_readers_e1_check_fails_its_test_where_it_misses(
    bug: CodecBug, tmp_path_factory: pytest.TempPathFactory, fixtures: Fixtures
) -> None:
    """E1 in the C codec's section loop: the same test as the Python loop's,
    with the planted C copy (after the first entry of a block, nothing
    escapes the real one) and the codec as it is built the same way. (Each
    codec's positions in a directory of its own no deeper than tmp_path: the
    snapshot paths have at most 8 components.)"""
    oracle = ORACLES["e1-decoding-loop-checks-the-first-entry-only"]
    for codec, escapes in (
        (build_codec(bug), {"middle", "last", "last-block"}),
        (build_codec(), set()),
    ):
        assert codec.BUG in (bug.number, 0)
        with mock.patch.object(ccodec, "CODEC", codec):
            code = planted(control(E1_PYTHON_LOOP))  # the real loops, callers rebound
            assert (
                positions_failing(
                    oracle, POSITIONS, tmp_path_factory.mktemp(f"codec{codec.BUG}"), code, fixtures
                )
                == escapes
            )


#: The planted checks that fail their test at every position: where a defect
#: passes at some position, its planted copy has run the test through the
#: same rebound callers there already; these have no such position.
EVERYWHERE = [bug for bug in BUGS if bug.escapes == set(ORACLES[bug.name].positions)]


@pytest.mark.parametrize("check_bug", EVERYWHERE, ids=lambda bug: bug.name)
def test_the_identity_control_of_a_planted_check_passes_where_it_fails(
    check_bug: CheckBug, tmp_path: Path, fixtures: Fixtures
) -> None:
    """The same callers rebound, the line unchanged: the test passes, so its
    failure on the planted check is the defect's."""
    failing = failing_positions(control(check_bug), check_bug.escapes, tmp_path, fixtures)
    assert failing == set()
