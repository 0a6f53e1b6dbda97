"""bench/targets.py: one table of an issue's benchmark targets, read from the
benchmarks' result files (``make bench`` prints issue 28's last)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _targets_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_targets", ROOT / "bench" / "targets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _target(name: str, issue: int, value: float, met: bool) -> dict[str, Any]:
    return {
        "name": name,
        "op": ">=",
        "limit": 0.7,
        "value": value,
        "met": met,
        "explanation": f"issue {issue}: why",
    }


def _write(directory: Path, name: str, document: dict[str, Any]) -> None:
    (directory / name).write_text(json.dumps(document))


def test_the_table_holds_the_issues_targets_of_every_full_run_and_no_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(
        tmp_path,
        "codec.json",
        {
            "config": {"entries": 1_000_000},
            "targets": [_target("owner 1M", 28, 0.74, True), _target("other", 13, 9.0, True)],
        },
    )
    _write(
        tmp_path,
        "codec_10m.json",
        {"config": {"entries": 10_000_000}, "targets": [_target("owner 10M", 28, 0.61, False)]},
    )
    _write(tmp_path, "gc.json", {"entries": 2_000_000, "targets": [_target("gc", 28, 0.6, True)]})
    _write(tmp_path, "codec_quick.json", {"targets": [_target("quick", 28, 0.1, False)]})
    assert _targets_module().main(["--issue", "28", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.endswith(".json") and "x  >=" in line]
    assert [row.split()[0:2] for row in rows] == [
        ["owner", "1M"],
        ["owner", "10M"],
        ["gc", "2,000,000"],
    ]
    assert "1,000,000" in rows[0] and "0.74x" in rows[0] and " MET " in rows[0]
    assert "10,000,000" in rows[1] and "NOT MET" in rows[1]
    assert "2 of 3 targets met" in out
    assert "quick" not in out and "other" not in out


def test_no_result_of_the_issue_is_said_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, "codec.json", {"targets": [_target("other", 13, 9.0, True)]})
    assert _targets_module().main(["--issue", "28", "--results", str(tmp_path)]) == 1
    assert "no result file" in capsys.readouterr().out
