"""The README's usage example runs and prints what its comments say."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_starts_with_the_two_commands() -> None:
    first = [line.split("#")[0].strip() for line in README.read_text().splitlines()[:2]]
    assert first == ["make demo", "make test"]


def run_block(index: int) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 3
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[index], "README.md", "exec"), {})
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
