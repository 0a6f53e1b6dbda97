"""Mutation testing of ``impl/cowstate`` with mutmut 3 (``make mutate``).

mutmut 3 mutates a copy of the sources and imports it from ``mutants/src``;
our library lives in ``impl/``, so this script stages a small project per
scope in ``build/mutation/<scope>/``: ``src/cowstate`` (a copy of
``impl/cowstate``), the killer tests, ``conftest.py`` (the per-test timeouts
of ``scripts/mutation_timeouts.py``) and a ``pyproject.toml`` with the mutmut
settings. The spec and the model are imported from the installed project,
the mutated library from the staging copy.

The mutated modules and their killer tests come in scopes. ``core``: the
map and its arithmetic, serializers, introspection and errors, killed by the
fast specification suite (the state machines, the invariant checker, bad
input, Flink's scenarios, the seed's worked examples, the arithmetic, the
error messages and the serializers).
``tables``: key groups, the state tables, the snapshot file format, the state
descriptors and keyed states, the heap backend, killed by their own tests
(key-group vectors, table scenarios and contracts, snapshot files, the
backend and its machine, the checkpoint rules for ``snapshot_to`` /
``restore_from``). ``checkpoint``: the coordinator, recovery, the checkpoint
storage, registry, handles, file system, paths and sealed documents, and the
RocksDB backend and table, killed by the checkpoint rules and recovery, the
tests of each checkpoint module, restore trust and all-or-nothing restore,
the RocksDB tests and a reduced storage machine
(``tests/test_storage_machine_reduced.py``). ``make mutate`` runs ``core``;
the others are run by name (``make mutate SCOPE=tables``). All of it runs
under the Hypothesis ``mutation`` profile (fixed seeds, no shrinking, no
database). Tests that rebuild broken implementations from the source text
(``bad_implementations``) cannot run on mutmut's trampolines and are left out.

Hanging mutants: every test gets a hard wall-clock timeout (pytest-timeout,
``max(10 s, 10 x its clean duration)``, capped by ``--timeout``), after
which the run ends with the status mutmut counts as "timeout" (or, if the
interpreter is stuck in C code holding the GIL, SIGALRM ends it 5 s later:
status -14, also "timeout"); mutmut's own CPU limit is ``(clean time + 1 s)
x 2 x TIMEOUT_MULTIPLIER``. ``make test`` has no timeouts: only the staged
runs load them.

mutmut runs in its ``forkserver`` isolation: every mutant's tests run in a
process forked from one that has only collected the tests. The default
(forking from mutmut's main process, which ran the statistics) breaks
RocksDB: the parent's RocksDB thread pool does not survive the fork, so the
first flush in a child waits forever, holding the GIL -- every RocksDB test
would "time out" on the unmutated code too, a false kill.

A run can be restricted to mutants by name (``--only 'cowstate.checkpoint.
registry.*'``, fnmatch patterns, repeatable; those are run again even if they
have a result), and ``--resume`` keeps the staged scope and mutmut's results
(refreshing the killer tests), so a stopped run continues where it stopped
and survivors are checked again after new tests; the staged library is
brought up to ``impl/cowstate`` first, and mutmut runs the mutants of the
functions edited since again. Each run's wall time is
added to ``build/mutation/<scope>/runs.json``. ``--recheck`` runs each
survivor (with ``--only``: each matching mutant not killed yet) against the
scope's marked tests only (after a control run with no mutant active;
``--max-children`` runs at once) and records the ones it kills in
``build/mutation/<scope>/rechecked.json``; the report counts them as killed.

Marked tests: a test written to kill mutants of a module carries
``@pytest.mark.kills(module="cowstate.checkpoint.sealed")`` (the mutants by
name in its comment) and lives beside the other tests of the behaviour it
pins. A scope's killers are the files it lists, whole; a file holding a test
marked for one of its modules must be among them (``tests/test_mutation_results.py``
checks it: a file joins a scope's killers by decision, since mutmut runs all
of it). ``--recheck`` runs the marked tests alone (collected with ``-m
"kills(module='...') or ..."``, run by node id) and the scope's
``recheck_with`` files. ``--list-tests`` prints both and runs nothing.

Results outlive ``build/``: every report also writes each staged scope's
results to ``docs/mutation-results/<scope>.json`` (per mutated file, mutmut's
hash of every function and the exit status of every mutant run, with
``rechecked.json`` and the run times), to be committed. Staging a scope
afresh puts them back as mutmut's ``.meta`` files, and mutmut keeps the
result of every mutant whose function's hash is unchanged: a run stopped in
one checkout continues in another (``--resume`` or not), and a function
edited since is run again.

The report (``build/mutation/report.md`` and ``.json``, also printed) covers
every staged scope: per module, mutants generated, killed, timed out,
survived (including "no tests"), equivalent, not run yet, and the kill rate
over the non-equivalent mutants that were run; per scope, the wall time of its
runs. Mutants listed in ``docs/equivalent-mutants.md`` are counted as
equivalent. Exit status 1 when a module misses the target or was not run to
the end.

    python scripts/mutation.py [--scope core] [--scope tables] [--scope checkpoint]
                               [--only GLOB ...] [--resume] [--recheck] [--max-children N]
                               [--timeout SECONDS] [--target 0.97] [--report-only]
                               [--list-tests]
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / "docs" / "equivalent-mutants.md"
RESULTS = ROOT / "docs" / "mutation-results"
TIMEOUTS = Path(__file__).resolve().with_name("mutation_timeouts.py")
#: mutmut's CPU limit per mutant is (clean time of its tests + 1 s) x 2 x this.
TIMEOUT_MULTIPLIER = 3.0


@dataclass(frozen=True)
class Scope:
    """Modules (file names under ``impl/cowstate``) and the tests that kill their mutants."""

    modules: tuple[str, ...]
    tests: tuple[str, ...]
    #: run whole by ``--recheck`` beside the tests marked ``kills`` for the scope's
    #: modules: killer tests that joined the scope after a run (their mutants need
    #: no full rerun)
    recheck_with: tuple[str, ...] = ()


SCOPES = {
    "core": Scope(
        (
            "state_map.py",
            "map_contract.py",
            "arithmetic.py",
            "serializers.py",
            "introspection.py",
            "errors.py",
        ),
        (
            "test_state_machine.py",
            "test_invariant_checker.py",
            "test_bad_input.py",
            "test_flink_map_scenarios.py",
            "test_seed_examples.py",
            "test_arithmetic.py",
            "test_error_messages.py",
            "test_copy_costs.py",
            "test_serializers.py",
            "test_default_serializer.py",
            "test_errors.py",
        ),
        recheck_with=("test_serializers.py", "test_default_serializer.py"),
    ),
    "tables": Scope(
        (
            "key_groups.py",
            "state_meta.py",
            "table_base.py",
            "state_table.py",
            "nested_table.py",
            "snapshot/format.py",
            "snapshot/writer.py",
            "snapshot/reader.py",
            "snapshot/restore.py",
            "descriptors.py",
            "keyed_state.py",
            "keyed_backend.py",
            "heap_backend.py",
        ),
        (
            "test_state_machine.py",
            "test_key_groups.py",
            "test_flink_table_scenarios.py",
            "test_table_contracts.py",
            "test_snapshot_io.py",
            "test_serializers.py",
            "test_backend.py",
            "test_backend_machine.py",
            "test_checkpoint_rules.py",
        ),
    ),
    "checkpoint": Scope(
        (
            "checkpoint/coordinator.py",
            "checkpoint/recovery.py",
            "checkpoint/storage.py",
            "checkpoint/registry.py",
            "checkpoint/handles.py",
            "checkpoint/filesystem.py",
            "checkpoint/paths.py",
            "checkpoint/sealed.py",
            "rocksdb/backend.py",
            "rocksdb/table.py",
        ),
        (
            "test_checkpoint_rules.py",
            "test_checkpoint_recovery.py",
            "test_checkpoint_storage.py",
            "test_checkpoint_registry.py",
            "test_checkpoint_filesystem.py",
            "test_checkpoint_paths.py",
            "test_checkpoint_sealed.py",
            "test_restore_trust.py",
            "test_all_or_nothing_restore.py",
            "test_rocksdb_backend.py",
            "test_rocksdb_table.py",
            "test_rocksdb_scan.py",
            "test_storage_machine_reduced.py",
            "test_storage_leak_regression.py",
        ),
        recheck_with=("test_storage_leak_regression.py",),
    ),
}
#: Copied with every scope's killer tests (and every ``tests/*_support.py``).
TEST_SUPPORT = ("conftest.py", "data", "java")

PYPROJECT = """\
[tool.mutmut]
source_paths = ["src/cowstate/"]
only_mutate = {only_mutate}
also_copy = ["conftest.py"]
process_isolation = "forkserver"
forkserver_warmup = "collect"
timeout_multiplier = {multiplier}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x", "--timeout={timeout}"]
pytest_add_cli_args_test_selection = ["tests/"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -14: "timeout",
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument(
        "--scope",
        action="append",
        choices=sorted(SCOPES),
        help="what to mutate (repeatable; default: core)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="run only the mutants whose names match (fnmatch; repeatable; run again)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the staged scope and mutmut's results (refresh the killer tests)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="cap of the per-test wall-clock timeout in seconds (default 300)",
    )
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="run each survivor of the scopes against the tests marked kills(module=...) "
        "for the scope's modules",
    )
    parser.add_argument(
        "--list-tests",
        action="store_true",
        help="print each scope's killer files and the tests --recheck runs; run nothing",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="report the staged scopes in build/mutation without running mutmut",
    )
    args = parser.parse_args(argv)
    if args.list_tests:
        for scope in args.scope or ["core"]:
            list_tests(scope)
        return 0
    if args.recheck:
        for scope in args.scope or ["core"]:
            recheck(scope, args.only, args.max_children)
    elif not args.report_only:
        for scope in args.scope or ["core"]:
            if args.resume and (BUILD / scope / "pyproject.toml").exists():
                refresh_sources(scope)
                refresh_tests(scope)
            else:
                stage(scope, args.timeout)
            started = time.monotonic()
            try:
                run_mutmut(scope, args.max_children, args.only)
            finally:  # a stopped run's time counts too: its results stay
                record_run(scope, args.only, time.monotonic() - started)
    for scope in staged_scopes():
        save_results(scope)
    text, summary, ok = report(collect(), run_times(), args.target)
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "report.md").write_text(text + "\n")
    (BUILD / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(text)
    print(f"\nreport written to {BUILD / 'report.md'}")
    return 0 if ok else 1


def stage(scope: str, timeout: float) -> None:
    """Copy the library and the scope's killer tests into a fresh staging project."""
    stage_dir = BUILD / scope
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    (stage_dir / "src").mkdir(parents=True)
    shutil.copytree(
        ROOT / "impl" / "cowstate",
        stage_dir / "src" / "cowstate",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    refresh_tests(scope)
    modules = [f"src/cowstate/{m}" for m in SCOPES[scope].modules]
    (stage_dir / "pyproject.toml").write_text(
        PYPROJECT.format(
            only_mutate=json.dumps(modules), multiplier=TIMEOUT_MULTIPLIER, timeout=timeout
        )
    )
    restore_results(scope)


def staged_scopes() -> list[str]:
    return [scope for scope in SCOPES if (BUILD / scope / "pyproject.toml").exists()]


def save_results(scope: str) -> None:
    """Write the staged scope's results to ``docs/mutation-results/<scope>.json``:
    per mutated file the functions' hashes and every mutant's exit status (null:
    not run yet), the rechecks and the run times."""
    stage_dir = BUILD / scope
    files = {}
    for path in sorted((stage_dir / "mutants" / "src").rglob("*.py.meta")):
        data = json.loads(path.read_text())
        files[str(path.relative_to(stage_dir / "mutants"))] = {
            "hash_by_function_name": data.get("hash_by_function_name", {}),
            "exit_code_by_key": data.get("exit_code_by_key", {}),
        }
    if not files:  # staged but never generated: nothing to keep
        return
    saved: dict[str, object] = {"files": files}
    for name in ("rechecked", "runs"):
        source = stage_dir / f"{name}.json"
        saved[name] = json.loads(source.read_text()) if source.exists() else None
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{scope}.json").write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")


def restore_results(scope: str) -> None:
    """Put the saved results of ``scope`` back into a fresh staging project as
    mutmut's ``.meta`` files (mutmut keeps the statuses of unchanged functions)."""
    source = RESULTS / f"{scope}.json"
    if not source.exists():
        return
    saved = json.loads(source.read_text())
    stage_dir = BUILD / scope
    for name, data in saved["files"].items():
        meta = stage_dir / "mutants" / name
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(
            json.dumps(
                {
                    "exit_code_by_key": data["exit_code_by_key"],
                    "hash_by_function_name": data["hash_by_function_name"],
                    "type_check_error_by_key": {},
                    "durations_by_key": {},
                    "estimated_durations_by_key": {},
                }
            )
        )
    for name in ("rechecked", "runs"):
        if saved.get(name) is not None:
            (stage_dir / f"{name}.json").write_text(json.dumps(saved[name], indent=2) + "\n")


#: mutmut's own first step of ``mutmut run``, alone: (re)generate the mutants of
#: every source file newer than its mutant file, keeping the results of every
#: function whose hash is unchanged (run in the staged project).
_REGENERATE = "from mutmut.__main__ import create_mutants; create_mutants(1)"


def refresh_sources(scope: str) -> None:
    """Bring the staged library up to ``impl/cowstate`` and regenerate the
    mutants of the files edited since: their changed functions' mutants are
    run again, every other result is kept (a resumed run, and a recheck,
    judge the library as it is now)."""
    stage_dir = BUILD / scope
    shutil.copytree(  # copy2 keeps the mtimes, so only edited files look newer
        ROOT / "impl" / "cowstate",
        stage_dir / "src" / "cowstate",
        ignore=shutil.ignore_patterns("__pycache__"),
        dirs_exist_ok=True,
    )
    if (stage_dir / "mutants").exists():
        subprocess.run(
            [sys.executable, "-c", _REGENERATE],
            cwd=stage_dir,
            check=True,
            capture_output=True,
        )


def refresh_tests(scope: str) -> None:
    """(Re)copy the scope's killer tests and the timeout plugin into its staging project.

    mutmut copies them on into ``mutants/`` at the start of each run and maps
    the mutants to tests it has not seen before, so a resumed run uses new tests."""
    stage_dir = BUILD / scope
    tests = stage_dir / "tests"
    if tests.exists():
        shutil.rmtree(tests)
    tests.mkdir(parents=True)
    names = list(SCOPES[scope].tests)
    support = sorted(p.name for p in (ROOT / "tests").glob("*_support.py"))
    for name in [*dict.fromkeys(names), *TEST_SUPPORT, *support]:
        source = ROOT / "tests" / name
        if source.is_dir():
            shutil.copytree(source, tests / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tests / name)
    shutil.copy(TIMEOUTS, stage_dir / "conftest.py")
    # Statistics without the function -> tests map (seen after an interrupted
    # run) would make mutmut report every mutant as "no tests": collect again.
    stats = stage_dir / "mutants" / "mutmut-stats.json"
    if stats.exists() and not json.loads(stats.read_text()).get("tests_by_mangled_function_name"):
        stats.unlink()


def scope_modules(scope: str) -> list[str]:
    """The dotted names of the scope's modules (``cowstate.checkpoint.sealed``)."""
    return ["cowstate." + m.removesuffix(".py").replace("/", ".") for m in SCOPES[scope].modules]


def marked_modules(path: Path) -> set[str]:
    """The modules the tests of ``path`` are marked ``kills`` for: every
    ``pytest.mark.kills(module="...")`` written in it, as pytest's ``-m`` reads it."""
    return {
        keyword.value.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.mark.kills"
        for keyword in node.keywords
        if keyword.arg == "module" and isinstance(keyword.value, ast.Constant)
    }


def killer_files(scope: str) -> list[str]:
    """The test files holding a test marked ``kills`` for a module of ``scope``
    (every one of them is among the scope's listed killers)."""
    modules = set(scope_modules(scope))
    return sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if marked_modules(p) & modules)


def marker_expression(scope: str) -> str:
    """The ``-m`` expression selecting the tests marked ``kills`` for the scope's modules."""
    return " or ".join(f"kills(module={module!r})" for module in scope_modules(scope))


def recheck_tests(scope: str) -> list[str]:
    """What ``--recheck`` runs, relative to the project root: every test marked
    ``kills`` for a module of ``scope`` (by node id without its parameters, so
    every parameter runs), then the scope's ``recheck_with`` files whole."""
    files = [f"tests/{name}" for name in killer_files(scope)]
    nodes: dict[str, None] = {}
    if files:
        env = dict(os.environ, COWSTATE_PROFILE="mutation", PYTHONHASHSEED="0")
        env.pop("CI", None)
        command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        collected = subprocess.run(
            [*command, "-m", marker_expression(scope), *files],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if collected.returncode != 0:
            raise SystemExit(f"collecting the tests of {scope} failed:\n{collected.stdout}")
        for line in collected.stdout.splitlines():
            if "::" in line:
                nodes[line.split("[", 1)[0]] = None
    return [*nodes, *(f"tests/{name}" for name in SCOPES[scope].recheck_with)]


def list_tests(scope: str) -> None:
    """Print the scope's killer files and the tests ``--recheck`` runs."""
    killers = SCOPES[scope].tests
    print(f"scope {scope}: {len(killers)} killer files")
    for name in killers:
        print(f"  tests/{name}")
    tests = recheck_tests(scope)
    print(f"--recheck runs {len(tests)} tests and files:")
    for test in tests:
        print(f"  {test}")


def run_mutmut(scope: str, max_children: int, only: list[str]) -> None:
    env = dict(os.environ, COWSTATE_PROFILE="mutation", PYTHONHASHSEED="0")
    env.pop("CI", None)
    mutmut = Path(sys.executable).with_name("mutmut")
    subprocess.run(
        [str(mutmut), "run", "--max-children", str(max_children), *only],
        cwd=BUILD / scope,
        env=env,
        check=True,
    )


def record_run(scope: str, only: list[str], elapsed: float) -> None:
    path = BUILD / scope / "runs.json"
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append({"only": only, "seconds": round(elapsed, 1), "finished": time.time()})
    path.write_text(json.dumps(runs, indent=2) + "\n")


def run_times() -> dict[str, float]:
    """Scope -> the summed wall time of its recorded runs (staged, else saved), in seconds."""
    out = {}
    for scope in SCOPES:
        path = BUILD / scope / "runs.json"
        saved = RESULTS / f"{scope}.json"
        if path.exists():
            runs = json.loads(path.read_text())
        elif saved.exists():
            runs = json.loads(saved.read_text()).get("runs") or []
        else:
            continue
        out[scope] = sum(run["seconds"] for run in runs)
    return out


def equivalent_mutants() -> dict[str, str]:
    """Mutant name -> the one-line argument, from docs/equivalent-mutants.md."""
    if not EQUIVALENT.exists():
        return {}
    out = {}
    for line in EQUIVALENT.read_text().splitlines():
        m = re.match(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def recheck(scope: str, only: list[str], jobs: int = 1) -> None:
    """Run every surviving mutant of ``scope`` (with ``only``: every one
    matching ``only`` not killed yet, not-run ones included) against the
    tests marked ``kills`` for the scope's modules (and its ``recheck_with``).

    mutmut ran each mutant against every killer test that reaches it; a
    survivor killed afterwards by a new test marked ``kills`` for its module
    (``recheck_tests``) is recorded as killed in
    ``build/mutation/<scope>/rechecked.json`` (the report applies it), without
    running the whole killer suite again. The tests run first with no mutant
    active and must pass, or nothing is recorded.
    """
    refresh_sources(scope)
    tests = recheck_tests(scope)
    mutants = BUILD / scope / "mutants"
    env = dict(
        os.environ,
        COWSTATE_PROFILE="mutation",
        PYTHONHASHSEED="0",
        PYTHONPATH=os.pathsep.join([str(mutants / "src"), str(ROOT / "model"), str(ROOT / "spec")]),
    )
    env.pop("CI", None)

    def run(mutant: str) -> int:
        """A fresh interpreter's pytest exit status with ``mutant`` active (124: hung)."""
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
        try:
            return subprocess.run(
                [*command, *tests],
                cwd=ROOT,
                env=dict(env, MUTANT_UNDER_TEST=mutant),
                capture_output=True,
                timeout=RECHECK_TIMEOUT,
            ).returncode
        except subprocess.TimeoutExpired:
            return 124

    if run("") != 0:
        raise SystemExit(
            f"the {len(tests)} recheck tests of {scope} (--list-tests) fail with no "
            "mutant active: nothing rechecked"
        )
    path = BUILD / scope / "rechecked.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    wanted = ("survived", "no tests") + (("not checked",) if only else ())
    equivalent = equivalent_mutants()
    todo = [
        (name, status)
        for statuses in collect().get(scope, {}).values()
        for name, status in statuses.items()
        if status in wanted
        and done.get(name) != "killed"
        and (not only or any(fnmatch.fnmatchcase(name, glob) for glob in only))
    ]
    # First each mutant in a child forked from a warm worker (tests imported
    # once): a test failure there (status 1) or a hang (its alarm, -14) is a
    # kill. Anything else -- a pass, an error -- is run again in a fresh
    # interpreter, which also sees the mutants that act only at import time.
    names = [name for name, _ in todo]
    forked: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        shares = [names[i::jobs] for i in range(jobs)]
        for part in pool.map(lambda share: forked_statuses(share, tests, env), shares):
            forked.update(part)
    again = [name for name in names if forked.get(name) not in FORKED_KILLS]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        fresh = dict(zip(again, pool.map(run, again), strict=True))
    for name, status in todo:
        killed = forked.get(name) in FORKED_KILLS or fresh.get(name, 0) != 0
        # one not killed stays "not run", unless it is argued equivalent: then no
        # killer can kill it (else the argument is wrong, and a full run kills it)
        if killed or status != "not checked" or name in equivalent:
            done[name] = "killed" if killed else "survived"
            print(f"{done[name]:8s} {name}", flush=True)
    path.write_text(json.dumps(done, indent=2, sort_keys=True) + "\n")


#: A fresh recheck run that takes longer than this (seconds) is a hang:
#: killed (the marked tests take a few seconds with the interpreter's start).
RECHECK_TIMEOUT = 30.0
#: Exit statuses of a forked recheck child that are kills: a test failed, or
#: the child hung until its alarm (``signal.alarm``) ended it.
FORKED_KILLS = (1, -14)

_FORK_WORKER = """
import os, signal, sys
import pytest

files = sys.argv[1:]
os.environ["MUTANT_UNDER_TEST"] = ""
pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *files])  # import them once
sys.stdout.flush()
for line in sys.stdin:
    name = line.strip()
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.environ["MUTANT_UNDER_TEST"] = name
        signal.alarm(30)  # a hang ends the child: a kill, as a mutmut timeout
        os._exit(int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *files])))
    _, status = os.waitpid(pid, 0)
    print("STATUS", os.waitstatus_to_exitcode(status), name, flush=True)
"""


def forked_statuses(names: list[str], tests: list[str], env: dict[str, str]) -> dict[str, int]:
    """Mutant -> pytest's exit status in a child of one warm worker process."""
    if not names:
        return {}
    done = subprocess.run(
        [sys.executable, "-c", _FORK_WORKER, *tests],
        cwd=ROOT,
        env=env,
        input="\n".join(names) + "\n",
        capture_output=True,
        text=True,
    )
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("STATUS "):
            _, code, name = line.split(" ", 2)
            out[name] = int(code)
    return out


def collect() -> dict[str, dict[str, dict[str, str]]]:
    """scope -> module -> mutant name -> status, from mutmut's .meta files of the
    staged scopes, and from ``docs/mutation-results`` for a scope not staged here."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for scope in SCOPES:
        config = BUILD / scope / "pyproject.toml"
        saved_path = RESULTS / f"{scope}.json"
        codes_by_file: dict[str, dict[str, int | None]] = {}
        if config.exists():
            staged = tomllib.loads(config.read_text())
            for path in staged["tool"]["mutmut"]["only_mutate"]:
                meta = BUILD / scope / "mutants" / f"{path}.meta"
                data = json.loads(meta.read_text()) if meta.exists() else {}
                codes_by_file[path] = data.get("exit_code_by_key", {})
            rechecked_path = BUILD / scope / "rechecked.json"
            rechecked = json.loads(rechecked_path.read_text()) if rechecked_path.exists() else {}
        elif saved_path.exists():
            saved = json.loads(saved_path.read_text())
            for meta_name, data in sorted(saved["files"].items()):
                codes_by_file[meta_name.removesuffix(".meta")] = data["exit_code_by_key"]
            rechecked = saved.get("rechecked") or {}
        else:
            continue
        out[scope] = {}
        for path, codes in codes_by_file.items():
            module = ".".join(Path(path).relative_to("src").with_suffix("").parts)
            statuses = {}
            for name, code in codes.items():
                status = STATUS.get(code, "suspicious")
                again = rechecked.get(name)
                # a kill by the marked tests counts; so does a survival of a
                # mutant mutmut never ran (recheck records only equivalent ones)
                if again == "killed" or (again == "survived" and status == "not checked"):
                    status = again
                statuses[name] = status
            out[scope][module] = statuses
    return out


def report(
    results: dict[str, dict[str, dict[str, str]]], seconds: dict[str, float], target: float
) -> tuple[str, dict[str, object], bool]:
    equivalent = equivalent_mutants()
    ok = True
    summary: dict[str, object] = {"target": target, "scopes": {}}
    lines = []
    survivors = []
    for scope, modules in results.items():
        wall = seconds.get(scope)
        lines += [
            f"### Scope `{scope}`"
            + (f" (mutmut runs: {wall / 60:.0f} min wall time)" if wall is not None else ""),
            "",
            "| module | generated | killed | timeout | survived | equivalent | not run | "
            "kill rate (non-equivalent, run) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        scope_summary: dict[str, object] = {"wall_seconds": wall, "modules": {}}
        for module, statuses in modules.items():
            counts = Counter(statuses.values())
            eq = [
                n for n, s in statuses.items() if s in ("survived", "no tests") and n in equivalent
            ]
            not_run = [n for n, s in statuses.items() if s == "not checked"]
            survived = [
                n
                for n, s in statuses.items()
                if s in ("survived", "suspicious", "no tests") and n not in equivalent
            ]
            killed = counts["killed"] + counts["timeout"] + counts["segfault"]
            run = len(statuses) - len(eq) - len(not_run)
            rate = killed / run if run else 1.0
            complete = not not_run
            ok = ok and rate >= target and complete
            survivors += survived
            shown = f"{rate:.1%}" if run else "-"
            lines.append(
                f"| {module} | {len(statuses)} | {counts['killed'] + counts['segfault']} "
                f"| {counts['timeout']} | {len(survived)} | {len(eq)} | {len(not_run)} "
                f"| {shown} |"
            )
            scope_summary["modules"][module] = {  # type: ignore[index]
                "generated": len(statuses),
                "killed": counts["killed"] + counts["segfault"],
                "timeout": counts["timeout"],
                "survived": survived,
                "equivalent": eq,
                "not_run": len(not_run),
                "kill_rate": rate,
            }
        summary["scopes"][scope] = scope_summary  # type: ignore[index]
        lines.append("")
    text = "\n".join(lines)
    if survivors:
        text += "\nSurviving non-equivalent mutants (`mutmut show NAME` in build/mutation/SCOPE):\n"
        text += "\n".join(f"- `{name}`" for name in survivors) + "\n"
    text += (
        f"\nTarget: kill rate >= {target:.0%} in every module, every mutant run: "
        f"{'MET' if ok else 'NOT MET'}."
    )
    return text, summary, ok


if __name__ == "__main__":
    sys.exit(main())
