"""Mutation results outlive ``build/``, and a scope finds its killer tests
wherever they live (``scripts/mutation.py``).

A scope's results are saved to ``docs/mutation-results/<scope>.json`` and put
back as mutmut's ``.meta`` files when the scope is staged afresh; mutmut then
keeps the status of every mutant whose function is unchanged and runs the
mutants of an edited function again. These tests stage a tiny scope in a
temporary directory, generate its mutants with mutmut itself, and check that
round trip, and that the report reads a saved scope that is not staged.

A test written to kill mutants of a module is marked
``@pytest.mark.kills(module=...)`` and lives beside the tests of what it pins:
the scope's staging copies the files it lists, and ``--recheck`` runs exactly
the marked tests of the scope's modules (checked here on a tiny tree of test
files); in the suite, every marker is one the script reads and names a
mutated module, and every file holding tests marked for a scope is one of the
scope's listed killers.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mutmut")

#: mutmut's own mutant generation for one file, as ``mutmut run`` does it first
#: (in a subprocess: mutmut reads its configuration from the working directory)
GENERATE = """
from pathlib import Path
from mutmut.__main__ import create_mutants_for_file
result = create_mutants_for_file(Path("src/cowstate/m.py"), Path("mutants/src/cowstate/m.py"))
assert result.error is None, result.error
"""

SOURCE = """\
def double(x):
    return x * 2


def halve(x):
    return x // 2
"""


@pytest.fixture
def mutation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/mutation.py, with its build and results directories under tmp_path."""
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts/mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "BUILD", tmp_path / "build")
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    return module


def _generate(stage_dir: Path) -> dict[str, int | None]:
    """mutmut's mutants of src/cowstate/m.py (as ``mutmut run`` makes them): their statuses."""
    output = stage_dir / "mutants/src/cowstate/m.py"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-c", GENERATE], cwd=stage_dir, check=True)
    meta = json.loads((stage_dir / "mutants/src/cowstate/m.py.meta").read_text())
    codes: dict[str, int | None] = meta["exit_code_by_key"]
    return codes


def _stage(mutation: ModuleType, source: str) -> Path:
    stage_dir: Path = mutation.BUILD / "core"
    (stage_dir / "src" / "cowstate").mkdir(parents=True)
    (stage_dir / "src" / "cowstate" / "m.py").write_text(source)
    (stage_dir / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["src/cowstate/"]\nonly_mutate = ["src/cowstate/m.py"]\n'
    )
    return stage_dir


def _set_codes(stage_dir: Path, codes: dict[str, int | None]) -> None:
    meta_path = stage_dir / "mutants/src/cowstate/m.py.meta"
    meta = json.loads(meta_path.read_text())
    meta["exit_code_by_key"] = codes
    meta_path.write_text(json.dumps(meta))


def test_saved_results_come_back_for_unchanged_functions_only(mutation: ModuleType) -> None:
    stage_dir = _stage(mutation, SOURCE)
    generated = _generate(stage_dir)
    doubles = [name for name in generated if "double" in name]
    halves = [name for name in generated if "halve" in name]
    assert doubles and halves and set(generated.values()) == {None}
    run: dict[str, int | None] = {name: (1 if i % 2 else 0) for i, name in enumerate(generated)}
    _set_codes(stage_dir, run)
    (stage_dir / "rechecked.json").write_text(json.dumps({doubles[0]: "killed"}))
    (stage_dir / "runs.json").write_text(json.dumps([{"only": [], "seconds": 12.5}]))
    mutation.save_results("core")

    # another checkout: nothing staged, halve() edited since the run
    shutil.rmtree(mutation.BUILD)
    stage_dir = _stage(mutation, SOURCE.replace("x // 2", "x >> 1"))
    mutation.restore_results("core")
    again = _generate(stage_dir)

    assert {name: again[name] for name in doubles} == {name: run[name] for name in doubles}
    assert all(again[name] is None for name in again if "halve" in name)
    assert json.loads((stage_dir / "rechecked.json").read_text()) == {doubles[0]: "killed"}
    assert mutation.run_times() == {"core": 12.5}


def test_the_report_reads_a_saved_scope_that_is_not_staged(mutation: ModuleType) -> None:
    stage_dir = _stage(mutation, SOURCE)
    generated = _generate(stage_dir)
    names = sorted(generated)
    codes: dict[str, int | None] = {name: 1 for name in names}
    codes[names[0]] = 0  # survived, then killed by a recheck
    codes[names[1]] = 0  # survived
    codes[names[2]] = None  # not run
    _set_codes(stage_dir, codes)
    (stage_dir / "rechecked.json").write_text(json.dumps({names[0]: "killed"}))
    staged = mutation.collect()
    mutation.save_results("core")
    shutil.rmtree(mutation.BUILD)

    saved = mutation.collect()
    assert saved == staged
    statuses = saved["core"]["cowstate.m"]
    assert statuses[names[0]] == "killed"
    assert statuses[names[1]] == "survived"
    assert statuses[names[2]] == "not checked"
    assert sum(status == "killed" for status in statuses.values()) == len(names) - 2


def test_a_scope_staged_but_never_generated_saves_nothing(mutation: ModuleType) -> None:
    _stage(mutation, SOURCE)
    mutation.save_results("core")
    assert not (mutation.RESULTS / "core.json").exists()


def test_a_refresh_brings_the_staged_library_up_to_date_and_reruns_edited_functions(
    mutation: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the library as it is now, in a project root of its own
    root = tmp_path / "root"
    (root / "impl" / "cowstate").mkdir(parents=True)
    monkeypatch.setattr(mutation, "ROOT", root)
    stage_dir = _stage(mutation, SOURCE)
    generated = _generate(stage_dir)
    run: dict[str, int | None] = dict.fromkeys(generated, 1)
    _set_codes(stage_dir, run)

    edited = SOURCE.replace("x // 2", "x >> 1")
    (root / "impl" / "cowstate" / "m.py").write_text(edited)  # newer than the mutants
    mutation.refresh_sources("core")

    assert (stage_dir / "src" / "cowstate" / "m.py").read_text() == edited
    meta = json.loads((stage_dir / "mutants/src/cowstate/m.py.meta").read_text())
    again: dict[str, int | None] = meta["exit_code_by_key"]
    assert {name: code for name, code in again.items() if "double" in name} == {
        name: 1 for name in generated if "double" in name
    }
    halves = [name for name in again if "halve" in name]
    assert halves and all(again[name] is None for name in halves)
    assert "x >> 1" in (stage_dir / "mutants/src/cowstate/m.py").read_text()


MARKED = """\
import pytest


@pytest.mark.kills(module="cowstate.m")
@pytest.mark.parametrize("x", [1, 2])
def test_marked(x: int) -> None:
    assert x


@pytest.mark.kills(module="cowstate.other")
def test_marked_for_another_module() -> None:
    pass


def test_unmarked() -> None:
    pass
"""

MARKED_CLASS = """\
import pytest


@pytest.mark.kills(module="cowstate.m")
class TestM:
    def test_one(self) -> None:
        pass
"""

UNMARKED = """\
def test_plain() -> None:
    pass
"""


def test_a_scope_stages_and_rechecks_the_tests_marked_for_its_modules(
    mutation: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    tests = root / "tests"
    for name in ("data", "java"):
        (tests / name).mkdir(parents=True)
    (tests / "conftest.py").write_text("")
    (tests / "test_a.py").write_text(MARKED)
    (tests / "test_b.py").write_text(UNMARKED)
    (tests / "test_c.py").write_text(MARKED_CLASS)
    (tests / "test_d.py").write_text(UNMARKED)
    monkeypatch.setattr(mutation, "ROOT", root)
    listed = ("test_a.py", "test_b.py", "test_c.py")
    scope = mutation.Scope(("m.py",), listed, recheck_with=("test_b.py",))
    monkeypatch.setattr(mutation, "SCOPES", {"core": scope})

    assert mutation.killer_files("core") == ["test_a.py", "test_c.py"]
    # the marked tests by node id (every parameter runs), then recheck_with whole
    assert mutation.recheck_tests("core") == [
        "tests/test_a.py::test_marked",
        "tests/test_c.py::TestM::test_one",
        "tests/test_b.py",
    ]
    mutation.refresh_tests("core")
    staged = mutation.BUILD / "core" / "tests"
    assert sorted(p.name for p in staged.glob("test_*.py")) == list(listed)  # not test_d.py


def test_every_file_with_tests_marked_for_a_scope_is_one_of_its_killers(
    mutation: ModuleType,
) -> None:
    for scope, declared in mutation.SCOPES.items():
        marked = mutation.killer_files(scope)
        assert marked, scope
        assert set(marked) <= set(declared.tests), (
            scope,
            sorted(set(marked) - set(declared.tests)),
        )


def test_every_kills_marker_names_a_mutated_module_as_the_script_reads_it(
    mutation: ModuleType,
) -> None:
    mutated = {module for scope in mutation.SCOPES for module in mutation.scope_modules(scope)}
    marked: set[str] = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.mark.kills":
                # one keyword, a literal: what `-m "kills(module='...')"` and the script match
                assert not node.args and [k.arg for k in node.keywords] == ["module"], path.name
                module = node.keywords[0].value
                assert isinstance(module, ast.Constant) and module.value in mutated, path.name
        marked |= mutation.marked_modules(path)
    # every scope has marked tests somewhere
    assert all(marked & set(mutation.scope_modules(scope)) for scope in mutation.SCOPES)


def test_no_test_file_is_named_after_how_its_tests_were_found() -> None:
    # Tests live beside the tests of what they pin (CONTRIBUTING, "Mutation
    # testing"); a mutant they kill is named in a marker and a comment.
    assert sorted(p.name for p in (ROOT / "tests").glob("*survivor*")) == []
