"""What a checkpoint or savepoint holds, for people: ``cowstate savepoint inspect DIR``.

:func:`inspect_snapshot` reads and verifies ``_metadata`` (seal, schema,
consistency, confined paths) and checks every file it lists (present, with
the recorded size; with ``verify=True`` also the CRC32); it opens only the
confined paths a :class:`~cowstate.checkpoint.location.SnapshotSource`
resolves. :func:`format_report` prints it: the kind and format, the states,
each subtask's key groups, the files with their scope and size (as written
in ``_metadata``: relative), and how many shared files -- which live in a
job's ``shared/`` directory, outside the snapshot's own -- it references. A
heap incremental checkpoint's subtask shows its chain: the base's bytes, the
deltas' count and bytes, and each file's role.
"""

from __future__ import annotations

from dataclasses import dataclass

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import CheckpointMetadata, FileHandle
from cowstate.checkpoint.location import SnapshotSource
from cowstate.checkpoint.storage import read_metadata
from cowstate.errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidArgumentError

__all__ = ["FileReport", "SnapshotReport", "format_report", "inspect_snapshot"]


@dataclass(frozen=True)
class FileReport:
    handle: FileHandle
    path: str
    #: ``ok``, ``missing``, ``size N`` (another size than recorded),
    #: ``crc mismatch`` or ``unreadable``.
    status: str


@dataclass(frozen=True)
class SnapshotReport:
    directory: str
    metadata: CheckpointMetadata
    files: list[list[FileReport]]  # per subtask

    @property
    def problems(self) -> list[FileReport]:
        return [f for subtask in self.files for f in subtask if f.status != "ok"]

    @property
    def total_size(self) -> int:
        return sum(f.handle.size for subtask in self.files for f in subtask)


def inspect_snapshot(
    directory: str, filesystem: FileSystem | None = None, *, verify: bool = False
) -> SnapshotReport:
    """Read the snapshot in ``directory`` and check its files (``verify``: their
    CRC32 too). Raises only :mod:`cowstate.errors` exceptions: a bad argument
    is an :class:`~cowstate.errors.InvalidArgumentError` before anything is read."""
    if filesystem is not None and not isinstance(filesystem, FileSystem):
        raise InvalidArgumentError(
            f"expected a FileSystem or None, got {type(filesystem).__name__}"
        )
    if not isinstance(verify, bool):
        raise InvalidArgumentError(f"expected verify to be True or False, got {verify!r}")
    filesystem = filesystem or FileSystem()
    metadata = read_metadata(filesystem, directory)  # the directory checked first (P5)
    source = SnapshotSource(filesystem, directory)
    files = []
    for handle in metadata.subtasks:
        reports = []
        for f in handle.files:
            path = source.path(f)
            reports.append(FileReport(f, path, _status(filesystem, source, f, path, verify)))
        files.append(reports)
    return SnapshotReport(directory.rstrip("/"), metadata, files)


def _status(
    filesystem: FileSystem, source: SnapshotSource, handle: FileHandle, path: str, verify: bool
) -> str:
    try:
        if not filesystem.exists(path):
            return "missing"
        size = filesystem.size(path)
    except (CorruptCheckpointError, CheckpointNotFoundError, OSError):
        return "unreadable"
    if size != handle.size:
        return f"size {size}"
    if verify:
        try:
            source.verify(handle)
        except CorruptCheckpointError:
            return "crc mismatch"
        except (CheckpointNotFoundError, OSError):
            return "unreadable"
    return "ok"


def format_report(report: SnapshotReport) -> str:
    """The report as the command prints it."""
    m = report.metadata
    kind = m.kind if m.kind == "checkpoint" else f"savepoint ({m.savepoint_format})"
    formats = sorted({(h.backend, h.format) for h in m.subtasks})
    lines = [
        f"{report.directory}",
        f"  {kind} {m.checkpoint_id} of job {m.job_id!r}",
        f"  backend/format : {', '.join(f'{b}/{f}' for b, f in formats) or 'none'}",
        f"  max parallelism: {m.max_parallelism}, {len(m.subtasks)} subtask(s)",
        f"  size           : {_size(report.total_size)} in "
        f"{sum(len(s) for s in report.files)} files",
    ]
    states = {(s.name, s.kind, s.state_serializer) for h in m.subtasks for s in h.states}
    lines.append(
        "  states         : "
        + (
            ", ".join(f"{name} ({kind}, {serializer})" for name, kind, serializer in sorted(states))
            or "none"
        )
    )
    outside = [f for subtask in report.files for f in subtask if f.handle.scope == "shared"]
    for index, (handle, files) in enumerate(zip(m.subtasks, report.files, strict=True)):
        start, end = handle.key_group_range
        lines.append(
            f"  subtask {index}: key groups {start}..{end}, "
            f"{_size(handle.full_size)} ({_size(handle.checkpointed_size)} uploaded "
            "by this snapshot)"
        )
        chain = handle.backend == "heap" and len(files) > 1  # cowstate.heap_incremental
        if chain:
            deltas = sum(f.handle.size for f in files[1:])
            lines.append(
                f"    chain: base {_size(files[0].handle.size)}, {(len(files) - 1) // 2} "
                f"delta(s) {_size(deltas)}"
            )
        for position, f in enumerate(files):
            role = f"  ({_chain_role(position)})" if chain else ""
            lines.append(
                f"    {f.handle.scope:<9} {_size(f.handle.size):>10}  {f.handle.path}{role}"
                + ("" if f.status == "ok" else f"  [{f.status.upper()}]")
            )
    lines.append(f"  shared files outside the directory: {len(outside)}")
    problems = report.problems
    lines.append(
        "  files: all present"
        if not problems
        else f"  files: {len(problems)} missing, unreadable, of another size or CRC32"
    )
    return "\n".join(lines)


def _chain_role(position: int) -> str:
    """What the file at ``position`` of a heap chain is (base, then pairs)."""
    if position == 0:
        return "base"
    return f"delta {(position + 1) // 2} {'changes' if position % 2 else 'removals'}"


def _size(n: int) -> str:
    size: float = n
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
