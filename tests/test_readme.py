"""The README's usage example runs and prints what its comments say."""

import contextlib
import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from cowstate_spec.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_starts_with_the_two_commands() -> None:
    first = [line.split("#")[0].strip() for line in README.read_text().splitlines()[:2]]
    assert first == ["make demo", "make test"]


def run_block(index: int, namespace: dict[str, Any] | None = None) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 4
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[index], "README.md", "exec"), {} if namespace is None else namespace)
    return out.getvalue().splitlines()


def test_readme_usage_example_runs_as_documented() -> None:
    lines = run_block(0)
    assert sorted(lines[:2]) == ["alice window-1 [1]", "bob window-1 [5]"]
    assert lines[2] == "[1, 2]"


def test_readme_checkpoint_example_prints_what_its_comments_say() -> None:
    assert run_block(2) == ["True", "11"]


def test_readme_backend_example_prints_what_its_comments_say() -> None:
    assert run_block(1) == [
        "0 KeyGroupRange(0, 63) ['carol']",
        "1 KeyGroupRange(64, 127) ['alice', 'bob']",
        "['alice:home', 'alice:cart']",
    ]


def test_readme_conformance_test_file_runs_under_the_fixture(cowstate_conformance: Any) -> None:
    namespace: dict[str, Any] = {}
    run_block(3, namespace)
    namespace["test_my_map"](cowstate_conformance)


@pytest.mark.parametrize("route", ["factory", "process"])
def test_readme_check_your_own_commands_run_as_written(route: str, tmp_path: Path) -> None:
    section = README.read_text().split("## Check your own implementation")[1].split("\n## ")[0]
    commands = [
        line.strip() for line in section.splitlines() if line.startswith("    cowstate check ")
    ]
    assert len(commands) == 2
    command = commands[0 if route == "factory" else 1]
    out = tmp_path / "out"
    argv = [*shlex.split(command)[1:], "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["operations_checked"] == 8 * 500
