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
    assert main(["check", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "--preset" in help_text
    assert help_text.startswith("usage: cowstate check")


def test_check_help_describes_the_run_and_lists_names_and_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from cowstate_spec.bad_implementations import BUGS
    from cowstate_spec.implementations import IMPLEMENTATIONS
    from cowstate_spec.workloads import PRESETS

    assert main(["check", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "against cowstate's implementations and the reference model" in help_text
    for implementation in IMPLEMENTATIONS:
        assert implementation.name in help_text
    for bug in BUGS:
        assert f"bad-{bug.name}" in help_text
    for name in PRESETS:
        assert name in help_text
    for status in ("0 success", "1 a finding", "2 bad input or usage", "3 environment"):
        assert status in help_text


def test_version_and_python_dash_m() -> None:
    from cowstate import __version__

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    version = subprocess.run(
        [sys.executable, "-m", "cowstate", "--version"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert version.returncode == 0
    assert version.stdout == f"cowstate {__version__}\n"
    help_text = subprocess.run(
        [sys.executable, "-m", "cowstate", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert help_text.returncode == 0
    assert help_text.stdout.startswith("usage: cowstate [-h] [--version] COMMAND")
    assert "inspect checkpoints and savepoints" in help_text.stdout
    assert "3  environment" in help_text.stdout


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
