"""The restore fuzzers (issue 15): corrupt snapshot files and checkpoint
directories the way an unlucky operator or an attacker would, read them
through every entry point, and classify every outcome.

Method
======

1. **Real inputs.** Fixtures are written by the library itself: heap snapshot
   files (all key groups, one subtask's, canonical) and a RocksDB canonical
   savepoint file (:mod:`~cowstate_spec.fuzz.files`); for directories, a
   heap, a RocksDB and a heap-chain job of two subtasks with two retained
   checkpoints (RocksDB: incremental, sharing SSTs; heap chains: a base and
   one, then two deltas with removals, beside another job of the same
   shape), a savepoint inside the job directory and canonical and native
   savepoints outside the storage root (:mod:`~cowstate_spec.fuzz.dirs`).
   Every state kind, two namespaces, 16 key groups; what each snapshot holds
   is recorded when it is taken.
2. **Corruptions by class.** Files: truncations, bit flips, byte runs and
   insertions in every region of the format, and crafted files whose CRCs are
   all valid (:mod:`~cowstate_spec.fuzz.layout` re-encodes them): blocks
   moved between key groups, keys in a foreign key group, ``None`` keys,
   namespaces and states, duplicates, undecodable bytes, a pickle payload,
   edited metadata. Directories (:mod:`~cowstate_spec.fuzz.dir_corruptions`):
   listed files damaged, deleted, replaced by links out of the root;
   ``_metadata`` torn, flipped, deleted, of another version; ``_metadata``
   *resealed* after structured edits (paths out of the root, ranges, ids,
   sizes, files, kinds, formats, serializers); the job's own files forged;
   heap chains broken (:mod:`~cowstate_spec.fuzz.chains`: deltas torn,
   reordered, missing, swapped with their removals, of another job, resealed
   chain edits).
3. **Every entry point.** Files: ``restore`` of a heap backend (and
   ``restore_from`` of a RocksDB backend for canonical files), into a fresh
   backend and into one holding other state. Directories:
   ``CheckpointCoordinator.restore`` in CLAIM, NO_CLAIM and LEGACY mode (then
   two checkpoints, so CLAIM subsumption deletes), ``recover()`` (then a
   checkpoint), ``inspect_snapshot``.
4. **Classification** (:mod:`~cowstate_spec.fuzz.outcomes`): ``clean``
   (a ``cowstate.errors`` exception, every backend unchanged), ``exact``
   (the snapshot's contents, each entry found by a lookup of its own key),
   ``fallback`` (``recover()`` restored an older retained checkpoint
   exactly), ``wrong`` (no error, other contents), ``partial`` (an error, but
   a backend changed), ``escaped`` (an exception outside ``cowstate.errors``),
   ``outside`` (a canary or other file outside what the entry point may touch
   was opened -- :class:`~cowstate_spec.fuzz.outcomes.Watch` wraps
   ``FileSystem.open`` and ``builtins.open`` -- or deleted, changed or
   created -- :func:`~cowstate_spec.fuzz.outcomes.manifest`). The last four
   fail a run.
5. **Reproducible by seed** (:mod:`~cowstate_spec.fuzz.runner`): a case is
   ``suite/class/k`` and draws everything from
   ``Random(f"{seed}/{suite}/{class}/{k}")``; ``--case`` replays it alone.
   Run with ``PYTHONHASHSEED=0`` (``make fuzz`` does): string keys then land
   in the same order in the fixtures' blocks. RocksDB fixtures are rebuilt
   per run (their SST names are random), so a RocksDB case replays the same
   damage on an equivalent, not byte-identical, tree.
6. **Proof that it can fail** (:mod:`~cowstate_spec.fuzz.planted`): planted
   defects -- a reader that drops bad blocks, unconfined paths, a restore
   that clears before it reads, a cleanup that deletes what the job does not
   own, chains whose files' checkpoints go unchecked -- must each be
   reported (``tests/test_fuzz.py``).

Run ``python -m cowstate_spec.fuzz`` (:mod:`~cowstate_spec.fuzz.cli`;
``make fuzz``: 100,000 file and 10,000 directory cases); the report is a
table per corruption class and outcome, a table per entry point, and a
reproducer for every case that failed, all of them written to
``build/fuzz/reproducers.txt``.

Modules: ``outcomes`` (classification, the watch, the manifest), ``jobs``
(the state every fixture holds), ``layout`` (snapshot files as parts),
``files`` and ``dirs`` / ``dir_corruptions`` / ``chains`` (the two
fuzzers), ``planted``,
``report``, ``runner``, ``cli``.
"""

from cowstate_spec.fuzz.outcomes import ACCEPTABLE, BAD, Outcome, Verdict
from cowstate_spec.fuzz.planted import PLANTED
from cowstate_spec.fuzz.report import CaseResult
from cowstate_spec.fuzz.runner import Fuzzer

__all__ = ["ACCEPTABLE", "BAD", "PLANTED", "CaseResult", "Fuzzer", "Outcome", "Verdict"]
