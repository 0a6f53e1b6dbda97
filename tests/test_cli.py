"""The ``cowstate`` console script (``cowstate.cli``) and the extras it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import EntryPoint, EntryPoints, entry_points
from pathlib import Path

import pytest

import cowstate.cli
from cowstate.cli import COMMAND_GROUP, EXIT_ENVIRONMENT, EXIT_USAGE, main
from cowstate_spec import MissingExtraFinder

ROOT = Path(__file__).resolve().parents[1]


def test_the_operations_cli_needs_nothing_of_the_spec() -> None:
    code = (
        "import sys, cowstate.cli; "
        "sys.exit(any(m.startswith(('cowstate_spec', 'hypothesis')) for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_help_lists_check_without_loading_the_spec() -> None:
    # Issue 27 finding 6: cowstate.cli imported the spec's main for `check`;
    # now it finds the command the spec registers and loads it only to run it.
    code = (
        "import sys, contextlib, io, cowstate.cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    status = cowstate.cli.main(['--help'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('cowstate_spec'))\n"
        "print(status, loaded, 'differential run: implementations' in out.getvalue())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.stdout == "0 [] True\n", result.stderr


def test_check_is_the_command_the_spec_registers() -> None:
    registered = entry_points(group=COMMAND_GROUP)
    assert [(e.name, e.value) for e in registered] == [("check", "cowstate_spec.cli:main")]


def registering(monkeypatch: pytest.MonkeyPatch, *entries: EntryPoint) -> None:
    """Make ``cowstate.cli``'s lookup find exactly ``entries`` in its group."""

    def lookup(*, group: str) -> EntryPoints:
        assert group == COMMAND_GROUP
        return EntryPoints(entries)

    monkeypatch.setattr(cowstate.cli, "entry_points", lookup)


def command(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=COMMAND_GROUP)


def echo(args: list[str]) -> int:
    """A command of another package: prints its arguments, returns their count."""
    print(" ".join(args))
    return len(args)


def test_without_the_spec_check_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registering(monkeypatch)
    assert main(["check", "--preset", "smoke", "--master", "in-process"]) == EXIT_ENVIRONMENT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "cowstate check: the differential run (cowstate_spec) is not installed: no package "
        "registers the command 'check' (entry point group 'cowstate.commands'); install it "
        "with: pip install 'cowstate[spark]'\n"
    )
    assert main(["--help"]) == 0
    assert "differential run" not in capsys.readouterr().out  # not listed either


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (
            [command("check", "cowstate_spec.cli:main"), command("check", "elsewhere.cli:main")],
            "cowstate check: expected one package to register the command 'check' (entry point "
            "group 'cowstate.commands'), 2 do: cowstate_spec.cli:main, elsewhere.cli:main; "
            "uninstall all but one",
        ),
        (
            [command("check", "cowstate_spec.no_such_module:main")],
            "cowstate check: the differential run (cowstate_spec) could not be loaded (No module "
            "named 'cowstate_spec.no_such_module'); install it with: pip install 'cowstate[spark]'",
        ),
        (
            [command("check", "cowstate.cli:COMMAND_GROUP")],
            "cowstate check: expected the command 'check' (cowstate.cli:COMMAND_GROUP) to be a "
            "function of the arguments, got str",
        ),
    ],
    ids=["registered twice", "not importable", "not callable"],
)
def test_a_check_that_cannot_run_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    entries: list[EntryPoint],
    expected: str,
) -> None:
    registering(monkeypatch, *entries)
    assert main(["check", "--help"]) == EXIT_ENVIRONMENT
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", expected + "\n")


def test_a_command_another_package_registers_is_listed_and_run_with_its_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registering(
        monkeypatch,
        command("echo", f"{__name__}:echo"),
        command("savepoint", f"{__name__}:echo"),  # the program's own command wins
    )
    assert main(["echo", "a", "--b"]) == 3
    assert capsys.readouterr().out == "echo a --b\n"
    assert main(["--help"]) == 0
    listed = " ".join(capsys.readouterr().out.split())
    assert f"echo from {__name__}:echo (cowstate echo --help)" in listed
    assert main(["savepoint", "inspect", "/nonexistent-cowstate-dir"]) == EXIT_USAGE
    assert capsys.readouterr().out == ""


def test_a_command_of_another_package_that_cannot_be_loaded_names_its_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registering(monkeypatch, command("lint", "elsewhere_not_installed.cli:main"))
    assert main(["lint"]) == EXIT_ENVIRONMENT
    assert capsys.readouterr().err == (
        "cowstate lint: the command 'lint' could not be loaded (No module named "
        "'elsewhere_not_installed'); reinstall the package of elsewhere_not_installed.cli:main\n"
    )


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
