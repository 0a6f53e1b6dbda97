"""Mutation testing of ``impl/cowstate`` with mutmut 3 (``make mutate``).

mutmut 3 mutates a copy of the sources and imports it from ``mutants/src``;
our library lives in ``impl/``, so this script stages a small project in
``build/mutation/``: ``src/cowstate`` (a copy of ``impl/cowstate``), the
killer tests, and a ``pyproject.toml`` with the mutmut settings. The spec and
the model are imported from the installed project, the mutated library from
the staging copy.

The mutated modules and their killer tests come in scopes. ``core``: the
map and its arithmetic, serializers, introspection and errors, killed by the
fast specification suite (the state machines, the invariant checker, bad
input, Flink's scenarios, the seed's worked examples, the arithmetic).
``tables``: key groups, the state tables, the snapshot file format, the state
descriptors and keyed states, the heap backend, killed by their own tests
(key-group vectors, table scenarios and contracts, snapshot files, the
backend and its machine, the checkpoint rules for ``snapshot_to`` /
``restore_from``). ``make mutate`` runs ``core``; ``tables`` is run by
name (``make mutate SCOPE=tables``): it takes hours here, because every
survivor runs the table and backend machines (see CONTRIBUTING.md for what it
has reached). The checkpoint layer and the RocksDB backend are not in a
scope yet: their killer tests (the storage machine, RocksDB) take minutes per
mutant. All of it runs under the Hypothesis ``mutation`` profile (fixed
seeds, no shrinking, no database). Tests that rebuild broken
implementations from the source text (``bad_implementations``) cannot run
on mutmut's trampolines and are left out.

The report (``build/mutation/report.md`` and ``.json``, also printed) counts
per module: mutants generated, killed, survived, timed out, and the kill rate
over non-equivalent mutants; mutants listed in ``docs/equivalent-mutants.md``
are counted as equivalent. Exit status 1 when a module misses the target.

    python scripts/mutation.py [--scope core] [--scope tables] [--max-children N]
                               [--target 0.97] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / "docs" / "equivalent-mutants.md"


@dataclass(frozen=True)
class Scope:
    """Modules (file names under ``impl/cowstate``) and the tests that kill their mutants."""

    modules: tuple[str, ...]
    tests: tuple[str, ...]


SCOPES = {
    "core": Scope(
        ("state_map.py", "arithmetic.py", "serializers.py", "introspection.py", "errors.py"),
        (
            "test_state_machine.py",
            "test_invariant_checker.py",
            "test_bad_input.py",
            "test_flink_map_scenarios.py",
            "test_seed_examples.py",
            "test_arithmetic.py",
            "test_error_messages.py",
            "test_copy_costs.py",
        ),
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
}
TEST_SUPPORT = ("conftest.py", "data", "java")

PYPROJECT = """\
[tool.mutmut]
source_paths = ["src/cowstate/"]
only_mutate = {only_mutate}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]
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
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}


def stage(scopes: list[str]) -> None:
    """Copy the library and the scopes' killer tests into a fresh staging project."""
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "src").mkdir(parents=True)
    shutil.copytree(
        ROOT / "impl" / "cowstate",
        STAGE / "src" / "cowstate",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (STAGE / "tests").mkdir()
    tests = {name for scope in scopes for name in SCOPES[scope].tests}
    for name in sorted(tests) + list(TEST_SUPPORT):
        source = ROOT / "tests" / name
        if source.is_dir():
            shutil.copytree(source, STAGE / "tests" / name)
        else:
            shutil.copy(source, STAGE / "tests" / name)
    modules = [f"src/cowstate/{m}" for scope in scopes for m in SCOPES[scope].modules]
    (STAGE / "pyproject.toml").write_text(PYPROJECT.format(only_mutate=json.dumps(modules)))


def run_mutmut(max_children: int) -> float:
    env = dict(os.environ, COWSTATE_PROFILE="mutation", PYTHONHASHSEED="0")
    env.pop("CI", None)
    mutmut = Path(sys.executable).with_name("mutmut")
    started = time.monotonic()
    subprocess.run(
        [str(mutmut), "run", "--max-children", str(max_children)], cwd=STAGE, env=env, check=True
    )
    return time.monotonic() - started


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


def collect() -> dict[str, dict[str, str]]:
    """module -> mutant name -> status, from mutmut's .meta files of the staged scopes."""
    staged = tomllib.loads((STAGE / "pyproject.toml").read_text())
    out: dict[str, dict[str, str]] = {}
    for path in staged["tool"]["mutmut"]["only_mutate"]:
        meta = STAGE / "mutants" / f"{path}.meta"
        data = json.loads(meta.read_text()) if meta.exists() else {}
        module = ".".join(Path(path).relative_to("src").with_suffix("").parts)
        out[module] = {
            name: STATUS.get(code, "suspicious")
            for name, code in data.get("exit_code_by_key", {}).items()
        }
    return out


def report(
    results: dict[str, dict[str, str]], elapsed: float | None, target: float
) -> tuple[str, dict[str, object], bool]:
    equivalent = equivalent_mutants()
    ok = True
    summary: dict[str, object] = {"elapsed_seconds": elapsed, "target": target, "modules": {}}
    lines = [
        "| module | generated | killed | timeout | survived | equivalent | "
        "kill rate (non-equivalent) |",
        "|---|---|---|---|---|---|---|",
    ]
    survivors = []
    for module, statuses in results.items():
        counts = Counter(statuses.values())
        eq = [
            name for name, status in statuses.items() if status == "survived" and name in equivalent
        ]
        survived = [
            name
            for name, status in statuses.items()
            if status in ("survived", "suspicious", "no tests", "not checked")
            and name not in equivalent
        ]
        killed = counts["killed"] + counts["timeout"] + counts["segfault"]
        non_equivalent = len(statuses) - len(eq)
        rate = killed / non_equivalent if non_equivalent else 1.0
        ok = ok and rate >= target
        survivors += survived
        lines.append(
            f"| {module} | {len(statuses)} | {counts['killed']} | {counts['timeout']} "
            f"| {len(survived)} | {len(eq)} | {rate:.1%} |"
        )
        summary["modules"][module] = {  # type: ignore[index]
            "generated": len(statuses),
            "killed": counts["killed"],
            "timeout": counts["timeout"],
            "survived": survived,
            "equivalent": eq,
            "kill_rate": rate,
        }
    text = "\n".join(lines)
    if survivors:
        text += "\n\nSurviving non-equivalent mutants (`mutmut show NAME` in build/mutation):\n"
        text += "\n".join(f"- `{name}`" for name in survivors)
    if elapsed is not None:
        text += f"\n\nmutmut run took {elapsed:.0f} s."
    text += f"\nTarget: kill rate >= {target:.0%} in every module: {'MET' if ok else 'NOT MET'}."
    return text, summary, ok


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
        "--report-only",
        action="store_true",
        help="report the last run in build/mutation without running mutmut",
    )
    args = parser.parse_args(argv)
    elapsed = None
    if not args.report_only:
        stage(args.scope or ["core"])
        elapsed = run_mutmut(args.max_children)
    text, summary, ok = report(collect(), elapsed, args.target)
    (STAGE / "report.md").write_text(text + "\n")
    (STAGE / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(text)
    print(f"\nreport written to {STAGE / 'report.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
