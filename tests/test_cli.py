"""The ``cowstate`` console script (``cowstate.cli``) and the extras it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cowstate.cli import main
from cowstate_spec import MissingExtraFinder

ROOT = Path(__file__).resolve().parents[1]


def test_the_operations_cli_needs_nothing_of_the_spec() -> None:
    code = (
        "import sys, cowstate.cli; "
        "sys.exit(any(m.startswith(('cowstate_spec', 'hypothesis')) for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_inspect_of_a_directory_without_metadata_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["savepoint", "inspect", str(tmp_path)]) == 2
    assert "cowstate savepoint inspect:" in capsys.readouterr().err


def test_check_is_handed_to_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "--help"])
    assert exit_info.value.code == 0
    assert "--preset" in capsys.readouterr().out


def test_a_missing_extra_is_named() -> None:
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'cowstate\[dev\]'"):
        MissingExtraFinder().find_spec("hypothesis.strategies")
    assert MissingExtraFinder().find_spec("json") is None
    # A process without site-packages: the spec's Hypothesis modules say what to install.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "spec")}
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import cowstate_spec.profiles"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode != 0
    assert "pip install 'cowstate[dev]'" in result.stderr
