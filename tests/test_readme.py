"""The README: its title and two commands first, examples that run and print
what their comments say with the extras they name, one place for make test's
time."""

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cowstate_spec.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_readme_starts_with_its_title_then_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[0] == "# cowstate"
    opening = [line.split("#")[0].strip() for line in lines[1 : lines.index("", 2)] if line]
    assert opening == ["make demo", "make test"]


def test_make_tests_time_is_stated_once_in_contributing_with_its_load() -> None:
    readme = " ".join(README.read_text().split())
    assert not re.search(r"`make test`[^.]*\babout \d", readme)
    assert "how long `make test` takes, and at what load that was measured, is in" in readme
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    (row,) = [line for line in contributing.splitlines() if line.startswith("| `make test` |")]
    assert re.search(r"\d+ min \d+ s", row) and "load" in row, row


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


#: The top-level modules each extra of pyproject.toml installs.
EXTRA_MODULES = {
    "rocksdb": ("rocksdict",),
    "spark": ("pyspark", "pyarrow", "pandas", "rich"),
    "dev": ("pytest", "hypothesis", "crosshair", "hypothesis_crosshair", "mutmut", "mypy"),
    "bench": ("immutables", "pyrsistent"),
}


def named_extras(index: int) -> set[str]:
    """The extras the README names for its ``index``-th Python example (the
    sentence right above it: "Needs the base install only." or "Needs the
    `x` extra ...")."""
    text = README.read_text()
    start = [m.start() for m in re.finditer(r"```python\n", text)][index]
    sentence = text[:start].rstrip().rsplit("\n\n", 1)[-1]
    assert sentence.startswith("Needs "), sentence
    return set(re.findall(r"`(\w+)` extra", sentence))


def run_hidden(index: int, hidden: set[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The ``index``-th example in a fresh Python where the modules of the
    ``hidden`` extras cannot be imported; an example that is a test file (it
    defines ``test_...`` functions) runs under pytest, its plug-ins loaded."""
    modules = sorted(m for extra in hidden for m in EXTRA_MODULES[extra])
    prelude = (
        "import sys\n"
        "class _NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] in {modules!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NotInstalled())\n"
    )
    block = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)[index]
    if re.search(r"^def test_", block, flags=re.M):
        example = tmp_path / "test_readme_example.py"
        example.write_text(block)
        argv = ["-q", "-p", "no:cacheprovider", str(example)]
        prelude += f"import pytest\nsys.exit(pytest.main({argv!r}))\n"
        block = ""
    return subprocess.run(
        [sys.executable, "-c", prelude + block],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=600,
        check=False,
    )


def test_the_extras_known_here_are_pyprojects() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(EXTRA_MODULES) == set(pyproject["project"]["optional-dependencies"])


@pytest.mark.parametrize(
    "index", [0, 1, 2, 3], ids=["usage", "keyed-state", "checkpoints", "conformance"]
)
def test_each_example_names_the_extras_it_needs_and_runs_with_only_those(
    index: int, tmp_path: Path
) -> None:
    """With every other extra hidden the example runs; with one it names hidden
    too, it fails for want of that one (README example 3 needed the `rocksdb`
    extra and did not say so)."""
    needed = named_extras(index)
    assert needed <= set(EXTRA_MODULES)
    others = set(EXTRA_MODULES) - needed
    ran = run_hidden(index, others, tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    for extra in sorted(needed):
        missing = run_hidden(index, others | {extra}, tmp_path)
        assert missing.returncode != 0
        assert any(f"No module named '{m}" in missing.stderr for m in EXTRA_MODULES[extra])


def test_the_cluster_demo_runs_exactly_the_readmes_cluster_commands_on_other_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scripts/cluster_demo.py (make cluster-demo) runs the README's commands;
    only the ports differ, each README port one free port of its own."""
    import importlib.util

    from cowstate_spec.local_cluster import README_PORTS, readme_cluster_commands

    spec = importlib.util.spec_from_file_location(
        "cluster_demo", ROOT / "scripts" / "cluster_demo.py"
    )
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    ran: list[list[str]] = []

    class Ran:
        pid = 0

        def __init__(self, argv: list[str], **options: object) -> None:
            ran.append(argv)

        def wait(self) -> int:
            return 0

    def no_group(pid: int, signal: int) -> None:
        raise ProcessLookupError

    monkeypatch.setattr(demo.subprocess, "Popen", Ran)
    monkeypatch.setattr(demo.os, "killpg", no_group)
    monkeypatch.setattr(demo.time, "sleep", lambda seconds: None)
    assert demo.main() == 0
    [[bash, echo, dash_c, script]] = ran
    assert (bash, echo, dash_c) == ("bash", "-v", "-c")
    readme = readme_cluster_commands(README.read_text())
    assert len(readme) >= 10 and any("deploy.master.Master" in line for line in readme)
    written = script.splitlines()
    assert len(written) == len(readme)
    ports: dict[str, str] = {}
    for mine, theirs in zip(written, readme, strict=True):
        assert re.sub(r"\d+", "N", mine) == re.sub(r"\d+", "N", theirs), (mine, theirs)
        for new, old in zip(re.findall(r"\d+", mine), re.findall(r"\d+", theirs), strict=True):
            if int(old) in README_PORTS:
                assert ports.setdefault(old, new) == new  # one free port for each
            else:
                assert new == old, (mine, theirs)
    assert sorted(ports) == [str(port) for port in README_PORTS]
    assert len(set(ports.values())) == len(ports)
    assert not set(ports.values()) & set(ports)


@pytest.mark.parametrize("form", ["full", "reduced"])
def test_the_cluster_test_runs_exactly_the_readmes_cluster_commands(form: str) -> None:
    """tests/test_cluster.py runs the README's commands: other ports, its own
    outputs, the venv by its path and the planted bug (with the executors'
    JVM options) added to the check --
    every other character as written; the reduced form (make test's) leaves
    out the spark-submit command and nothing else."""
    from test_cluster import PLANTED, VENV, cluster_test_script, is_spark_submit

    from cowstate_spec.local_cluster import README_PORTS, readme_cluster_commands

    ports = {port: 40001 + n for n, port in enumerate(README_PORTS)}
    outs = [Path("/outputs/check"), Path("/outputs/submit")]
    written = cluster_test_script(ports, outs, PLANTED, submit=form == "full").splitlines()
    readme = readme_cluster_commands(README.read_text())
    submits = [n for n, line in enumerate(readme) if is_spark_submit(line)]
    assert len(submits) == 1
    if form == "reduced":
        del readme[submits[0]]
    assert len(written) == len(readme) >= 10
    planted = "".join(f" {shlex.quote(argument)}" for argument in PLANTED)
    checks = [n for n, line in enumerate(readme) if ".venv/bin/cowstate check " in line]
    assert len(checks) == 1 and not readme[checks[0]].endswith(planted)

    def as_readme(line: str) -> str:
        line = line.replace(f"{VENV}/", ".venv/").replace("$PWD/.venv/", ".venv/")
        for old, new in ports.items():
            line = line.replace(str(new), str(old))
        return line.replace("/outputs/check", "out/cluster").replace(
            "/outputs/submit", "out/cluster"
        )

    for n, (mine, theirs) in enumerate(zip(written, readme, strict=True)):
        if n == checks[0]:
            assert mine.endswith(planted), mine
            mine = mine.removesuffix(planted)
        assert as_readme(mine) == as_readme(theirs), (mine, theirs)
    assert sum("/outputs/check" in line for line in written) == 1
    assert sum("/outputs/submit" in line for line in written) == (form == "full")
    assert all(str(port) not in "\n".join(written) for port in README_PORTS)


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
