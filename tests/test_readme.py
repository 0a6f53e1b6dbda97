"""The README's usage example runs and prints what its comments say."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_starts_with_the_two_commands() -> None:
    first = [line.split("#")[0].strip() for line in README.read_text().splitlines()[:2]]
    assert first == ["make demo", "make test"]


def test_readme_usage_example_runs_as_documented() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert sorted(lines[:2]) == ["alice window-1 [1]", "bob window-1 [5]"]
    assert lines[2] == "[1, 2]"
