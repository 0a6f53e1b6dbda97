"""What a checkpoint or savepoint holds, for people: ``cowstate savepoint inspect DIR``.

:func:`inspect_snapshot` reads ``_metadata`` and checks every file it lists
(present, with the recorded size); :func:`format_report` prints it: the kind
and format, the states, each subtask's key groups, the files with their
scope and size, and which shared files it references outside its directory.
"""

from __future__ import annotations

from dataclasses import dataclass

from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import CheckpointMetadata, FileHandle
from cowstate.checkpoint.location import SnapshotSource
from cowstate.checkpoint.storage import read_metadata

__all__ = ["FileReport", "SnapshotReport", "format_report", "inspect_snapshot"]


@dataclass(frozen=True)
class FileReport:
    handle: FileHandle
    path: str
    #: ``ok``, ``missing``, or ``size N`` (another size than recorded).
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


def inspect_snapshot(directory: str, filesystem: FileSystem | None = None) -> SnapshotReport:
    """Read the snapshot in ``directory`` and check its files."""
    filesystem = filesystem or FileSystem()
    metadata = read_metadata(filesystem, directory)
    source = SnapshotSource(filesystem, directory)
    files = []
    for handle in metadata.subtasks:
        reports = []
        for f in handle.files:
            path = source.path(f)
            if not filesystem.exists(path):
                status = "missing"
            else:
                size = filesystem.size(path)
                status = "ok" if size == f.size else f"size {size}"
            reports.append(FileReport(f, path, status))
        files.append(reports)
    return SnapshotReport(directory.rstrip("/"), metadata, files)


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
    outside = [
        f
        for subtask in report.files
        for f in subtask
        if not f.path.startswith(report.directory + "/")
    ]
    for index, (handle, files) in enumerate(zip(m.subtasks, report.files, strict=True)):
        start, end = handle.key_group_range
        lines.append(
            f"  subtask {index}: key groups {start}..{end}, "
            f"{_size(handle.full_size)} ({_size(handle.checkpointed_size)} uploaded "
            "by this snapshot)"
        )
        for f in files:
            where = f.handle.path if f.handle.relative else f.path
            lines.append(
                f"    {f.handle.scope:<9} {_size(f.handle.size):>10}  {where}"
                + ("" if f.status == "ok" else f"  [{f.status.upper()}]")
            )
    lines.append(f"  shared files outside the directory: {len(outside)}")
    problems = report.problems
    lines.append(
        "  files: all present"
        if not problems
        else f"  files: {len(problems)} missing or of another size"
    )
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
