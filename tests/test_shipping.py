"""The archive that ships the checker to executors without cowstate."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cowstate
from cowstate_spec import cmap_view
from cowstate_spec.shipping import MANIFEST, activate, build_archive, interpreter_tag
from cowstate_spec.workloads import WorkloadSpec


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_archive(tmp_path_factory.mktemp("archive"))


def test_the_archive_holds_the_packages_and_their_dependencies(archive: Path) -> None:
    names = set(zipfile.ZipFile(archive).namelist())
    for expected in (
        "cowstate/__init__.py",
        "cowstate/py.typed",
        "cowstate_model/state_map.py",
        "cowstate_spec/spark_job.py",
        "pydantic/__init__.py",
        "yaml/__init__.py",
        "fsspec/__init__.py",
        "typing_extensions.py",
        MANIFEST,
    ):
        assert expected in names
    assert any(n.startswith("pydantic_core/_pydantic_core.") and n.endswith(".so") for n in names)
    if cmap_view.PROBE is not None:  # the C map and the probe that checks it travel together
        for module in ("cowstate/_cmap.", "cowstate_spec/_cmap_probe."):
            assert any(n.startswith(module) and n.endswith(".so") for n in names), module
    assert not any("__pycache__" in n or n.endswith((".pyc", ".c")) for n in names)
    assert not any(n.startswith(("pyspark/", "pyarrow/", "hypothesis/")) for n in names)
    manifest = json.loads(zipfile.ZipFile(archive).read(MANIFEST))
    assert manifest["python"] == interpreter_tag()


def test_the_same_sources_make_the_same_archive(archive: Path, tmp_path: Path) -> None:
    again = build_archive(tmp_path)
    assert again.name == archive.name
    assert again.read_bytes() == archive.read_bytes()


def test_the_unpacked_archive_alone_runs_a_workload(archive: Path, tmp_path: Path) -> None:
    """An isolated interpreter without site-packages, only the archive on its path."""
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(archive).extractall(unpacked)
    code = """
import json, sys
sys.path.insert(0, sys.argv[1])
from cowstate_spec.spark_job import run_index
from cowstate_spec.workloads import WorkloadSpec
from cowstate_spec import cmap_view
import cowstate, pydantic
records = run_index(WorkloadSpec(workloads=1, operations_per_workload=300), 0)
probe = cmap_view.PROBE
print(json.dumps({
    "origins": [m.__file__.startswith(sys.argv[1]) for m in (cowstate, pydantic)],
    "implementation": cowstate.IMPLEMENTATION,
    "probe": None if probe is None else probe.__file__.startswith(sys.argv[1]),
    "records": [[r["implementation"], r["applied"], r["divergence_at"]] for r in records],
}))
"""
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(unpacked)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["origins"] == [True, True]
    assert found["implementation"] == cowstate.IMPLEMENTATION  # the C map travels too
    # and its probe, which checks it there (no C map without its checker)
    assert found["probe"] == (None if cmap_view.PROBE is None else True)
    assert found["records"] == [[name, 300, None] for name in WorkloadSpec().implementations]


@pytest.mark.skipif(cmap_view.PROBE is None, reason="the probe is not built here")
def test_without_the_probe_an_executor_checks_no_c_map_and_says_why(
    archive: Path, tmp_path: Path
) -> None:
    """An archive whose probe is missing: the C map imports but cannot be checked,
    so it is no default implementation, and asking for it names the probe."""
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(archive).extractall(unpacked)
    for probe in (unpacked / "cowstate_spec").glob("_cmap_probe.*"):
        probe.unlink()
    code = """
import json, sys
sys.path.insert(0, sys.argv[1])
import cowstate
from cowstate_spec.implementations import by_name
from cowstate_spec.workloads import WorkloadSpec
try:
    by_name("c-map")
    refusal = None
except KeyError as exc:
    refusal = str(exc)
print(json.dumps({"implementation": cowstate.IMPLEMENTATION,
                  "default": WorkloadSpec().implementations, "refusal": refusal}))
"""
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(unpacked)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["implementation"] == "c"  # the map itself is there
    assert found["default"] == ["cow-map"]
    assert "checked through its probe, which did not import here" in found["refusal"]
    assert "_cmap_probe" in found["refusal"]


def test_activation_refuses_another_python_and_a_missing_archive(tmp_path: Path) -> None:
    from pyspark import SparkFiles

    previous = SparkFiles._root_directory, SparkFiles._is_running_on_worker
    SparkFiles._root_directory, SparkFiles._is_running_on_worker = str(tmp_path), True
    try:
        with pytest.raises(RuntimeError, match="compiled for cpython-399-elsewhere, expected"):
            activate({"name": "cowstate-executor-x.zip", "python": "cpython-399-elsewhere"})
        with pytest.raises(RuntimeError, match="expected Spark to have unpacked"):
            activate({"name": "cowstate-executor-x.zip", "python": interpreter_tag()})
        (tmp_path / "cowstate-executor-x.zip").mkdir()
        (tmp_path / "cowstate-executor-x.zip" / MANIFEST).write_text("{}")
        activate({"name": "cowstate-executor-x.zip", "python": interpreter_tag()})
        assert sys.path[0] == str(tmp_path / "cowstate-executor-x.zip")
    finally:
        SparkFiles._root_directory, SparkFiles._is_running_on_worker = previous
        if sys.path and sys.path[0] == str(tmp_path / "cowstate-executor-x.zip"):
            sys.path.pop(0)
