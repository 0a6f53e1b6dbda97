"""Regressions of shared files the storage machine found under random seeds
(``test_storage_machine.py::test_storage_agrees_with_the_model[rocksdb-1]``):
a leak of a CLAIMed checkpoint's shared files, and an SST a pending
checkpoint reused deleted under it (the last two tests).

The leak, the machine's step list reduced by hand: job B restores job A's RocksDB
checkpoint in CLAIM mode; B's first checkpoint builds incrementally on the
claimed SST files (same storage root) and subsumes the claimed checkpoint,
deleting its exclusive files, ``_metadata`` and claim marker -- the claim is
settled: the claimed shared files B's checkpoints still use are B's to delete
(rule 8, ``restored_from.settled``). B crashes and recovers,
and its next checkpoint no longer uses those files (in the machine a
compaction replaced them; here a full checkpoint). The recovered coordinator
had forgotten the settlement (it lived in memory only: recovery R4 adopts the
CLAIMed snapshot only while its ``_metadata`` exists), so subsumption refused
to delete them and they stayed in A's ``shared/`` for ever. The settling
checkpoint's ``_metadata`` now says so (``restored_from.settled``, rule 8).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from restore_support import dump, fill, rocks

from cowstate.checkpoint.coordinator import CheckpointCoordinator, CompletedCheckpoint
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import RestoreMode
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend


class Backends:
    """RocksDB subtasks (one owning every key group) with local directories of
    their own, closed at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.made: list[RocksDBKeyedStateBackend] = []

    def new(self) -> RocksDBKeyedStateBackend:
        backend = rocks(self.tmp_path / "local" / str(len(self.made)))
        self.made.append(backend)
        return backend


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[Backends]:
    made = Backends(tmp_path)
    try:
        yield made
    finally:
        for backend in made.made:
            backend.close()


def storage(tmp_path: Path, job_id: str) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "root"), job_id, FileSystem())


def checkpoint(coordinator: CheckpointCoordinator) -> int:
    return coordinator.complete_checkpoint(coordinator.trigger_checkpoint()).checkpoint_id


def job_a_checkpoint(backends: Backends, tmp_path: Path) -> CompletedCheckpoint:
    """Job A's first checkpoint of 20 keys (RocksDB: shared SSTs), A closed."""
    first = backends.new()
    fill(first, range(20))
    job_a = CheckpointCoordinator(storage(tmp_path, "a"), [first])
    checkpoint(job_a)
    claimed = job_a.latest_checkpoint
    assert claimed is not None
    job_a.close()
    return claimed


def claim(
    backends: Backends, tmp_path: Path, claimed: CompletedCheckpoint, job_id: str = "b"
) -> CheckpointCoordinator:
    """Job ``job_id`` (B unless said), restored from ``claimed`` in CLAIM mode."""
    return CheckpointCoordinator.restore(
        storage(tmp_path, job_id), [backends.new()], claimed.directory, RestoreMode.CLAIM
    )


def test_recover_deletes_the_shared_files_of_a_settled_claim_once_no_checkpoint_uses_them(
    backends: Backends, tmp_path: Path
) -> None:
    claimed = job_a_checkpoint(backends, tmp_path)
    assert claimed.checkpoint_id == 1
    shared = claimed.shared_paths(FileSystem())
    assert shared and all(p.startswith(str(tmp_path / "root" / "a" / "shared")) for p in shared)

    # Job B CLAIMs A's checkpoint; its first checkpoint reuses the claimed SSTs
    # and subsumes the claimed checkpoint: the claim is settled.
    second = backends.new()
    job_b = CheckpointCoordinator.restore(
        storage(tmp_path, "b"), [second], claimed.directory, RestoreMode.CLAIM
    )
    contents = dump(second)
    assert checkpoint(job_b) == 2
    reusing = job_b.latest_checkpoint
    assert reusing is not None
    assert set(shared) <= set(reusing.shared_paths(job_b.storage.filesystem))
    assert not Path(claimed.directory).exists()  # subsumed: exclusive files, marker, _metadata
    assert all(Path(p).exists() for p in shared)  # still used by chk-2

    # B crashes (nothing more of the old coordinator runs) and recovers from chk-2.
    third = backends.new()
    recovered = CheckpointCoordinator.recover(storage(tmp_path, "b"), [third])
    assert recovered.recovery is not None
    assert recovered.recovery.restored_from == reusing.directory
    assert dump(third) == contents

    # Its next checkpoint reuses nothing: chk-2 is subsumed, and with it the
    # last use of the claimed SSTs, which are B's to delete.
    recovered.force_full = True
    assert checkpoint(recovered) == 3
    assert recovered.refused_deletions == []  # was: the claimed SSTs, refused
    assert [p for p in shared if Path(p).exists()] == []
    assert dump(third) == contents
    assert sorted(str(p) for p in (tmp_path / "root" / "a").rglob("*") if p.is_file()) == [
        str(tmp_path / "root" / "a" / "_counter")
    ]
    recovered.close()


def test_recover_never_deletes_the_shared_files_of_a_claim_another_job_took_over(
    backends: Backends, tmp_path: Path
) -> None:
    """The other side of rule 8: the job whose claim was revoked (a second CLAIM
    of the same checkpoint) never settles it, before a crash or after, even
    once the new owner subsumed the snapshot and its directory is gone."""
    claimed = job_a_checkpoint(backends, tmp_path)
    shared = claimed.shared_paths(FileSystem())

    job_b = claim(backends, tmp_path, claimed)
    job_c = claim(backends, tmp_path, claimed, "c")  # revokes B's claim
    checkpoint(job_b)  # builds on A's SSTs; the claimed checkpoint is no longer B's
    assert job_b.refused_deletions == [claimed.directory]
    checkpoint(job_c)  # C subsumes it: settled, and the SSTs are C's
    assert not Path(claimed.directory).exists()

    recovered = CheckpointCoordinator.recover(storage(tmp_path, "b"), [backends.new()])
    recovered.force_full = True
    checkpoint(recovered)
    assert recovered.refused_deletions == shared
    assert all(Path(p).exists() for p in shared)  # C's latest checkpoint uses them
    recovered.close()
    job_c.close()


@pytest.mark.parametrize("acknowledged", [True, False], ids=["acknowledged", "writing"])
def test_a_pending_checkpoint_keeps_the_shared_files_it_reuses_when_an_older_one_completes(
    backends: Backends, tmp_path: Path, acknowledged: bool
) -> None:
    """The storage machine's lost SST (random profile, rocksdb, retain 1):
    trigger 1, trigger 2, complete 1; 3 is triggered on 1's SSTs (rule 1);
    completing 2 subsumed 1 and deleted its SSTs, which pending 3 had
    acknowledged as its own; 3 completed on missing files and did not restore.
    Not acknowledged yet, 3 keeps every file it could have reused."""
    backend = backends.new()
    fill(backend, range(20))
    job = CheckpointCoordinator(storage(tmp_path, "a"), [backend])
    first, second = job.trigger_checkpoint(), job.trigger_checkpoint()
    job.acknowledge(second)
    job.complete_checkpoint(first)
    first_shared = set(job.completed_checkpoints[0].shared_paths(job.storage.filesystem))
    third = job.trigger_checkpoint()
    if acknowledged:
        job.acknowledge(third)
    contents = dump(backend)
    fill(backend, range(3), tag="later")  # after 3's synchronous part
    job.complete_checkpoint(second)  # 2 uploaded its own copies: 1's SSTs are unused
    assert all(Path(p).exists() for p in first_shared)  # pending 3 uses them
    completed = job.complete_checkpoint(third)
    used = set(completed.shared_paths(job.storage.filesystem))
    assert first_shared <= used  # 3 really built on 1
    assert all(Path(p).exists() for p in used)
    assert job.refused_deletions == []
    on_disk = {str(p) for p in (tmp_path / "root" / "a" / "shared").rglob("*") if p.is_file()}
    assert on_disk == used  # 2's copies went with 2: no leak either

    restored = backends.new()
    again = CheckpointCoordinator.restore(
        storage(tmp_path, "b"), [restored], completed.directory, RestoreMode.NO_CLAIM
    )
    assert dump(restored) == contents
    again.close()
    job.close()


def test_an_aborted_pending_checkpoint_releases_the_shared_files_it_kept(
    backends: Backends, tmp_path: Path
) -> None:
    """The other side: once the pending checkpoint that kept an older one's
    SSTs is aborted, nothing uses them and they are deleted."""
    backend = backends.new()
    fill(backend, range(20))
    job = CheckpointCoordinator(storage(tmp_path, "a"), [backend])
    first, second = job.trigger_checkpoint(), job.trigger_checkpoint()
    job.acknowledge(second)
    job.complete_checkpoint(first)
    first_shared = set(job.completed_checkpoints[0].shared_paths(job.storage.filesystem))
    third = job.trigger_checkpoint()
    job.acknowledge(third)
    completed = job.complete_checkpoint(second)
    assert all(Path(p).exists() for p in first_shared)
    job.abort_checkpoint(third)
    assert [p for p in first_shared if Path(p).exists()] == []
    on_disk = {str(p) for p in (tmp_path / "root" / "a" / "shared").rglob("*") if p.is_file()}
    assert on_disk == set(completed.shared_paths(job.storage.filesystem))
    assert job.refused_deletions == []
    job.close()


def test_only_the_checkpoint_that_subsumes_a_claimed_snapshot_says_the_claim_is_settled(
    backends: Backends, tmp_path: Path
) -> None:
    """Rule 8's record: with four retained, the claimed checkpoint is subsumed
    by the fourth checkpoint after the restore; the ones before it do not say
    settled (the claim still holds by its marker), it and the ones after do."""
    claimed = job_a_checkpoint(backends, tmp_path)
    job_b = claim(backends, tmp_path, claimed)
    job_b.num_retained = 4
    said = []
    for _ in range(5):
        completed = job_b.complete_checkpoint(job_b.trigger_checkpoint())
        assert completed.metadata.restored_from is not None
        said.append(completed.metadata.restored_from.settled)
        assert Path(claimed.directory).exists() is not completed.metadata.restored_from.settled
    assert said == [False, False, False, True, True]
    job_b.close()


def test_a_claim_settled_by_a_recovery_keeping_fewer_checkpoints_is_recorded(
    backends: Backends, tmp_path: Path
) -> None:
    """Recovery retaining fewer checkpoints than the job did subsumes the claimed
    snapshot itself (R5): no completion predicted that, so the checkpoints
    after it must still record the settlement, or a second crash forgot it."""
    claimed = job_a_checkpoint(backends, tmp_path)
    shared = claimed.shared_paths(FileSystem())
    job_b = claim(backends, tmp_path, claimed)
    job_b.num_retained = 3
    checkpoint(job_b)  # builds on the claimed SSTs; the claimed snapshot is kept
    assert Path(claimed.directory).exists()

    recovered = CheckpointCoordinator.recover(storage(tmp_path, "b"), [backends.new()])
    assert not Path(claimed.directory).exists()  # R5, one retained: settled here
    completed = recovered.complete_checkpoint(recovered.trigger_checkpoint())
    assert completed.metadata.restored_from is not None
    assert completed.metadata.restored_from.settled

    again = CheckpointCoordinator.recover(storage(tmp_path, "b"), [backends.new()])
    again.force_full = True
    checkpoint(again)
    assert again.refused_deletions == []
    assert [p for p in shared if Path(p).exists()] == []
    again.close()


def test_a_recovery_that_settles_a_claim_deletes_the_claimed_files_nothing_uses(
    backends: Backends, tmp_path: Path
) -> None:
    """The same recovery, when the checkpoint it keeps no longer uses the claimed
    SSTs: it settles the claim and deletes them in one subsumption (R5)."""
    claimed = job_a_checkpoint(backends, tmp_path)
    shared = claimed.shared_paths(FileSystem())
    job_b = claim(backends, tmp_path, claimed)
    job_b.num_retained = 3
    checkpoint(job_b)  # reuses the claimed SSTs
    job_b.force_full = True
    checkpoint(job_b)  # uses none of them
    assert all(Path(p).exists() for p in shared)

    recovered = CheckpointCoordinator.recover(storage(tmp_path, "b"), [backends.new()])
    assert recovered.refused_deletions == []
    assert not Path(claimed.directory).exists()
    assert [p for p in shared if Path(p).exists()] == []
    recovered.close()
