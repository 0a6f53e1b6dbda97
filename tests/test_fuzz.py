"""The restore fuzzers (``cowstate_spec.fuzz``) in ``make test``: a reduced run
over every corruption class with no wrong, partial, escaped or outside
outcome; planted defects the fuzzers must report; the canary.
"""

from __future__ import annotations

import builtins
import os
import pickle
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from cowstate.errors import CowStateError
from cowstate.snapshot import SnapshotReader
from cowstate_spec.fuzz import BAD, PLANTED, CaseResult, Fuzzer, Outcome
from cowstate_spec.fuzz.cli import main
from cowstate_spec.fuzz.dir_corruptions import DIR_CLASSES
from cowstate_spec.fuzz.files import FILE_CLASSES, pickle_payload
from cowstate_spec.fuzz.layout import parse
from cowstate_spec.fuzz.outcomes import Watch, manifest, manifest_changes
from cowstate_spec.fuzz.runner import DIR_KINDS

SEED = 0
REDUCED_FILE_CASES = 1000
#: About 4.5 cases a class: each meets the five entry points, nearly.
REDUCED_DIR_CASES = 230
#: The heap-chain classes (cowstate_spec.fuzz.chains), on the chain fixture only.
CHAIN_CLASSES = sorted(c for c in DIR_CLASSES if c.startswith("chain:"))
RESTORES = ("claim", "no-claim", "legacy")


@pytest.fixture(scope="module")
def fuzzer() -> Iterator[Fuzzer]:
    with Fuzzer(SEED, rocks_share=0.3) as f:
        yield f


def _bad(results: list[CaseResult]) -> list[str]:
    return [
        f"{r.case_id}: {r.description} -> {r.verdict.outcome}: {r.verdict.detail}"
        for r in results
        if r.verdict.outcome in BAD
    ]


# ---------------------------------------------------------------- the reduced run


def test_reduced_file_run_restores_exactly_or_refuses_cleanly(fuzzer: Fuzzer) -> None:
    results = fuzzer.run_files(REDUCED_FILE_CASES)
    assert len(results) == REDUCED_FILE_CASES
    assert {r.case_id.split("/")[1] for r in results} == set(FILE_CLASSES)
    assert _bad(results) == []
    outcomes = Counter(r.verdict.outcome for r in results)
    assert outcomes[Outcome.CLEAN] > 0 and outcomes[Outcome.EXACT] > 0


def test_reduced_directory_run_restores_exactly_or_refuses_cleanly(fuzzer: Fuzzer) -> None:
    results = fuzzer.run_dirs(REDUCED_DIR_CASES)
    assert {r.case_id.split("/")[1] for r in results} == set(DIR_CLASSES)
    assert _bad(results) == []
    assert {r.entry for r in results} == {"claim", "no-claim", "legacy", "recover", "inspect"}
    assert {r.description.split()[0] for r in results} == set(DIR_KINDS)
    outcomes = Counter(r.verdict.outcome for r in results)
    assert outcomes[Outcome.CLEAN] and outcomes[Outcome.EXACT] and outcomes[Outcome.FALLBACK]


def test_every_chain_class_damages_a_heap_chain_and_every_restore_of_it_is_refused(
    fuzzer: Fuzzer,
) -> None:
    """Each ``chain:*`` class damages a chain checkpoint (of at least the deltas
    it needs) in every case; every restore of the damaged chain is refused
    cleanly -- none of them restores, in whole or in part -- and recovery
    falls back or refuses."""
    results = fuzzer.run_dirs(len(CHAIN_CLASSES) * 6, CHAIN_CLASSES)
    assert _bad(results) == []
    targets = {"chain:reordered": ("chk-3",), "chain:resealed": ("chk-3",)}
    for cls in CHAIN_CLASSES:
        ours = [r for r in results if r.cls == cls]
        assert len(ours) == 6
        for result in ours:
            kind, target = result.description.split()[:2]
            assert kind == "heap-incremental"
            assert target.rstrip(":") in targets.get(cls, ("chk-2", "chk-3")), result
        restores = [r for r in ours if r.entry in RESTORES]
        assert len(restores) >= 3
        assert all(r.verdict.outcome is Outcome.CLEAN for r in restores), restores


# ------------------------------------------------------------ the fuzzers can fail


@pytest.mark.parametrize(
    ("plant", "suite", "classes", "expected"),
    [
        ("reader-drops-bad-blocks", "files", ["bitflip:payload", "byterun:payload"], Outcome.WRONG),
        ("restore-clears-first", "files", ["bitflip:payload", "truncate:index"], Outcome.PARTIAL),
        ("no-key-group-check", "files", ["crafted:foreign-key"], Outcome.WRONG),
        (
            "paths-unconfined",
            "dirs",
            ["reseal:path-absolute", "reseal:path-dotdot"],
            Outcome.OUTSIDE,
        ),
        ("deletes-unowned", "dirs", ["job:counter"], Outcome.OUTSIDE),
        ("chain-checkpoints-unchecked", "dirs", ["chain:missing"], Outcome.WRONG),
    ],
)
def test_a_planted_defect_is_reported(
    fuzzer: Fuzzer, plant: str, suite: str, classes: list[str], expected: Outcome
) -> None:
    count = 40 if suite == "files" else 20
    run = fuzzer.run_files if suite == "files" else fuzzer.run_dirs
    control = run(count, classes)
    assert _bad(control) == []
    with PLANTED[plant]():
        planted = run(count, classes)
    assert any(r.verdict.outcome is expected for r in planted), Counter(
        r.verdict.outcome for r in planted
    )


def test_a_replayed_case_has_the_same_outcome(fuzzer: Fuzzer) -> None:
    first = fuzzer.run_files(120)
    for result in random.Random(1).sample(first, 5):
        again = fuzzer.run_case(result.case_id)
        assert (again.description, again.verdict) == (result.description, result.verdict)
    directory = fuzzer.run_dirs(10)[7]
    again = fuzzer.run_case(directory.case_id)
    assert again.verdict.outcome is directory.verdict.outcome
    with pytest.raises(CowStateError):
        fuzzer.run_case("files/no-such-class/1")


# ---------------------------------------------------------------------- the canary


def test_the_canary_outside_the_root_is_never_read_or_deleted(fuzzer: Fuzzer) -> None:
    """Every way of pointing at the canary (absolute, ``..``, schemes, links
    inside the snapshot, links replacing files), through every entry point."""
    classes = [
        "reseal:path-absolute",
        "reseal:path-dotdot",
        "reseal:path-scheme",
        "reseal:path-symlink",
        "file:symlink-out",
        "reseal:disowned",
    ]
    results = fuzzer.run_dirs(len(classes) * 10, classes)
    assert [r.case_id for r in results if r.verdict.outcome is Outcome.OUTSIDE] == []


def test_the_watch_sees_a_read_of_the_canary_and_the_manifest_its_deletion(
    tmp_path: Path,
) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret").write_text("do not read")
    (tmp_path / "allowed").write_text("fine")
    watch = Watch()
    watch.reset(str(tmp_path), [str(tmp_path / "allowed")])
    original = builtins.open
    with watch.installed():
        assert builtins.open is not original
        with open(tmp_path / "allowed") as f:
            f.read()
        assert watch.reads == []
        pickle.loads(pickle_payload(str(canary / "secret"))).close()  # what a payload does
    assert watch.reads == [str(canary / "secret")]
    assert builtins.open is original
    before = manifest(str(canary), lambda p: True)
    os.unlink(canary / "secret")
    assert manifest_changes(before, manifest(str(canary), lambda p: True)) == [
        f"deleted {canary / 'secret'}"
    ]


# ------------------------------------------------------------- crafted files


def test_crafted_files_pass_every_checksum(fuzzer: Fuzzer) -> None:
    """The crafted classes re-encode the file: the reader's CRC checks pass and
    only its other checks (or the restore's) are left to refuse it."""
    suite = fuzzer.file_suite
    for fixture in suite.fixtures:
        image, _regions = parse(fixture.data)
        assert image.encode() == fixture.data
        for cls in ("crafted:block-moved", "crafted:foreign-key", "crafted:duplicate-other"):
            mutation = FILE_CLASSES[cls](fixture, random.Random(cls), suite.canary)
            reader = SnapshotReader(mutation.data)
            for key_group in reader.offsets:
                reader.read_key_group(key_group)


def test_the_command_reports_and_fails_on_a_bad_case(tmp_path: Path) -> None:
    out = tmp_path / "reproducers.txt"
    good = ["--seed", "0", "--cases-dirs", "0", "--reproducers", str(out)]
    assert main([*good, "--cases-files", "30", "--classes", "truncate:header"]) == 0
    bad = [*good, "--cases-files", "20", "--classes", "crafted:foreign-key"]
    bad += ["--plant", "no-key-group-check"]
    assert main(bad) == 1
    assert "--case files/crafted:foreign-key/" in out.read_text()
