"""Shipping the checker to Spark executors that do not have cowstate installed.

Executors need only Python and PySpark's own Python dependencies (pyarrow for
``mapInArrow``); everything else travels with the job, the way PySpark
documents it for a packed environment: one archive given to
``SparkContext.addArchive``, which Spark copies to every executor and unpacks
in the executor's working directory before the job's first task there.

Why an archive of site-packages, not a zip for ``addPyFile`` and not a
venv-pack archive:

- A zip on ``sys.path`` is read by ``zipimport``, which cannot load extension
  modules; the C map (``cowstate._cmap``) and pydantic's core
  (``pydantic_core._pydantic_core``) are extension modules. Spark *unpacks*
  an archive, so its extension modules load like installed ones.
- A venv-pack archive holds the whole driver environment: PySpark's jars,
  pyarrow, the dev tools, several hundred MB. This archive holds only the
  three packages of the distribution (``cowstate``, ``cowstate_model``,
  ``cowstate_spec``, with the C map as built on the driver) and the
  distributions ``pip install cowstate`` brings (pydantic and its core,
  pyyaml, fsspec, ...), about 10 MB.

Like venv-pack's archives it holds compiled code, so it runs only on
executors with the driver's Python version and platform: the archive records
both (``MANIFEST``) and an executor that differs fails its first task with a
message naming both, never with an obscure import error.

How the archive reaches ``sys.path`` without a setting on the cluster: the
function Spark runs on the executors is :func:`executor_entry`, and this
module is registered with cloudpickle to be pickled *by value*, so the
executor can unpickle it before anything of cowstate is importable there. It
puts the unpacked archive first on ``sys.path`` and then imports the checker.
The same works under ``spark-submit`` (``addArchive`` runs on the live
context) and needs no ``spark.executorEnv`` or ``--archives`` from the user.

Rules of this module (it is pickled by value):

1. Functions that run on executors import only the standard library and
   PySpark at their top, and everything else after :func:`activate`.
2. The archive's name carries a hash of its contents, so a changed checker
   is never confused with an archive an executor unpacked earlier.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import sysconfig
import zipfile
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST",
    "PACKAGES",
    "ArchiveInfo",
    "activate",
    "build_archive",
    "executor_entry",
    "interpreter_tag",
    "ship",
    "ship_modules",
]

#: The packages of the cowstate distribution (see pyproject.toml).
PACKAGES = ("cowstate", "cowstate_model", "cowstate_spec")
#: The name of the manifest inside the archive.
MANIFEST = "cowstate-executor.json"
#: What the executors need beyond the three packages, when the installed
#: distribution's metadata cannot be read (running from a source tree).
_FALLBACK_REQUIREMENTS = ("pydantic", "pyyaml", "fsspec", "msgpack")

#: ``{"name": archive file name, "python": interpreter tag}``: what an executor
#: needs to find and check the unpacked archive (plain data: it is pickled).
ArchiveInfo = dict[str, str]


def interpreter_tag() -> str:
    """The implementation, version and platform compiled code is built for,
    e.g. ``cpython-311-x86_64-linux-gnu``."""
    soabi = sysconfig.get_config_var("SOABI")
    if soabi:
        return str(soabi)
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


def build_archive(directory: Path) -> Path:
    """Write the executor archive into ``directory`` and return its path.

    The archive holds the three packages (from wherever this process imports
    them: an installed distribution, an editable install or a source tree),
    every distribution they need, and :data:`MANIFEST`.
    """
    files = dict(_package_files())
    for distribution in _requirement_closure():
        files.update(_distribution_files(distribution))
    manifest = {
        "python": interpreter_tag(),
        "packages": list(PACKAGES),
        "distributions": sorted(d.metadata["Name"] for d in _requirement_closure()),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name in sorted(files):
            archive.writestr(_entry(name), files[name].read_bytes())
        archive.writestr(_entry(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    data = buffer.getvalue()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"cowstate-executor-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    path.write_bytes(data)
    return path


def ship(spark_context: Any) -> ArchiveInfo:
    """Build the archive, hand it to ``spark_context`` (``addArchive``) once
    per application, and register this module to be pickled by value.

    Returns what :func:`executor_entry` needs to activate it. The archive
    lives in a directory of this process until it exits: Spark serves the
    file from there whenever an executor asks for it first."""
    from pyspark import cloudpickle

    path = build_archive(_staging())
    key = (str(spark_context.applicationId), path.name)
    if key not in _SHIPPED:
        spark_context.addArchive(str(path))
        _SHIPPED.add(key)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    return {"name": path.name, "python": interpreter_tag()}


def build_module_archive(directory: Path, names: Iterable[str]) -> Path:
    """Write an archive of the top-level modules or packages ``names`` (a user's
    implementation, see :func:`ship_modules`) into ``directory``."""
    import importlib.util

    files: dict[str, Path] = {}
    for name in sorted(set(names)):
        found = importlib.util.find_spec(name)
        if found is None or (found.origin is None and not found.submodule_search_locations):
            raise ModuleNotFoundError(f"expected module {name!r} to ship, found none", name=name)
        if found.submodule_search_locations:
            root = Path(next(iter(found.submodule_search_locations)))
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    files[f"{name}/{path.relative_to(root).as_posix()}"] = path
        else:
            assert found.origin is not None
            origin = Path(found.origin)
            files[origin.name] = origin
    manifest = {"python": interpreter_tag(), "modules": sorted(set(names))}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name in sorted(files):
            archive.writestr(_entry(name), files[name].read_bytes())
        archive.writestr(_entry(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    data = buffer.getvalue()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"cowstate-user-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    path.write_bytes(data)
    return path


def ship_modules(spark_context: Any, names: Iterable[str]) -> ArchiveInfo:
    """Ship the top-level modules ``names`` (the packages of the user's
    ``package.module:factory`` implementations) like :func:`ship`: an archive
    the executors unpack and put first on ``sys.path``."""
    from pyspark import cloudpickle

    path = build_module_archive(_staging(), names)
    key = (str(spark_context.applicationId), path.name)
    if key not in _SHIPPED:
        spark_context.addArchive(str(path))
        _SHIPPED.add(key)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    return {"name": path.name, "python": interpreter_tag()}


def executor_entry(
    batches: Iterator[Any],
    *,
    target: str,
    archive: ArchiveInfo | None,
    arguments: dict[str, Any],
    modules: ArchiveInfo | None = None,
) -> Iterator[Any]:
    """Executor side: activate the archive (if shipped) and the user's modules
    (if any), then run ``target`` (``"module:function"``) on ``batches`` with
    ``arguments``."""
    if archive is not None:
        activate(archive)
    if modules is not None:
        activate(modules)
    import importlib

    module_name, _, function_name = target.partition(":")
    function: Callable[..., Iterator[Any]] = getattr(
        importlib.import_module(module_name), function_name
    )
    return function(batches, **arguments)


def activate(archive: ArchiveInfo) -> None:
    """Put the unpacked ``archive`` first on this executor's ``sys.path``.

    Raises ``RuntimeError`` naming both interpreters when this executor's
    Python is not the one the archive was built for, and when Spark did not
    unpack the archive where its files should be.
    """
    from pyspark import SparkFiles

    root = os.path.abspath(os.path.join(SparkFiles.getRootDirectory(), archive["name"]))
    if root in sys.path:
        return
    here = interpreter_tag()
    if here != archive["python"]:
        raise RuntimeError(
            f"cowstate's executor archive holds code compiled for {archive['python']}, "
            f"expected this executor's Python ({sys.executable}) to be the same, got {here}: "
            "run the executors on the driver's Python version and platform"
        )
    if not os.path.isfile(os.path.join(root, MANIFEST)):
        raise RuntimeError(
            f"expected Spark to have unpacked {archive['name']} into {root}, "
            "found no manifest there"
        )
    sys.path.insert(0, root)


# ------------------------------------------------------------------ helpers

#: (application id, archive name) of every archive this process shipped.
_SHIPPED: set[tuple[str, str]] = set()
_STAGING: list[Path] = []


def _staging() -> Path:
    """This process's directory for archives (removed when it exits)."""
    if not _STAGING:
        import atexit
        import shutil
        import tempfile

        directory = Path(tempfile.mkdtemp(prefix="cowstate-ship-"))
        atexit.register(shutil.rmtree, directory, True)
        _STAGING.append(directory)
    return _STAGING[0]


def _package_files() -> Iterator[tuple[str, Path]]:
    """(name in the archive, file) of every file of the three packages this
    process imports: sources, stubs, markers and extension modules built for
    this interpreter (never caches, never C sources)."""
    import importlib

    suffixes = tuple(s for s in _extension_suffixes())
    for package in PACKAGES:
        module = importlib.import_module(package)
        root = Path(next(iter(module.__path__)))
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            name = path.name
            if name.endswith((".py", ".pyi", "py.typed")) or name.endswith(suffixes):
                yield f"{package}/{path.relative_to(root).as_posix()}", path


def _entry(name: str) -> zipfile.ZipInfo:
    """A zip entry with a fixed date and mode: the same files give the same bytes."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def _extension_suffixes() -> list[str]:
    import importlib.machinery

    return list(importlib.machinery.EXTENSION_SUFFIXES)


def _requirement_closure() -> list[metadata.Distribution]:
    """The installed distributions cowstate's base install needs, transitively."""
    try:
        roots = _requirements(metadata.distribution("cowstate"))
    except metadata.PackageNotFoundError:
        roots = list(_FALLBACK_REQUIREMENTS)
    seen: dict[str, metadata.Distribution] = {}
    pending = list(roots)
    while pending:
        name = _normalize(pending.pop())
        if name in seen:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency of a dependency, not installed here
        seen[name] = distribution
        pending.extend(_requirements(distribution))
    return list(seen.values())


def _requirements(distribution: metadata.Distribution) -> list[str]:
    """The names of the requirements of ``distribution`` that apply here
    (extras never; environment markers evaluated when ``packaging`` is there)."""
    names = []
    for line in distribution.requires or []:
        requirement, _, marker = line.partition(";")
        if "extra" in marker:
            continue
        if marker.strip() and not _marker_holds(marker):
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        if match:
            names.append(match.group(1))
    return names


def _marker_holds(marker: str) -> bool:
    try:
        from packaging.markers import Marker
    except ImportError:  # without packaging: include it, an extra package is harmless
        return True
    return bool(Marker(marker.strip()).evaluate())


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution_files(distribution: metadata.Distribution) -> Iterable[tuple[str, Path]]:
    """The files ``distribution`` installed into its site-packages directory
    (not scripts elsewhere, not bytecode caches)."""
    for file in distribution.files or []:
        name = file.as_posix()
        if name.startswith("..") or "__pycache__" in name or name.endswith(".pyc"):
            continue
        path = Path(str(distribution.locate_file(file)))
        if path.is_file():
            yield name, path
