"""A Spark standalone cluster on loopback, from the README's own commands.

What the cluster test (``tests/test_cluster.py``) and ``make cluster-demo``
run the check against is what the README tells a user to type, in its "On a
cluster" section: build an executors' Python without cowstate, write the
cluster's ``spark-defaults.conf``, start a master and two workers from the
installed pyspark, run ``cowstate check`` and ``spark-submit``, stop them.

- :func:`readme_cluster_commands` reads those commands from the README;
- :func:`readme_cluster_script` makes them one bash script, with other ports
  (:func:`free_port`), other output directories and, for a test, arguments
  added to the ``cowstate check`` command -- nothing else changed;
- :func:`clean_environment` is this process's environment without what would
  let another Python find this one's packages: the script's, so that the
  executors' Python workers prove the checker was shipped
  (:mod:`cowstate_spec.shipping`).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from collections.abc import Mapping, Sequence

__all__ = [
    "QUICK_JVM",
    "README_PORTS",
    "clean_environment",
    "free_port",
    "readme_cluster_commands",
    "readme_cluster_script",
]


#: JVM options for short runs on few cores: the client compiler only (no C2
#: compiler threads competing for the cores) and the serial collector.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_environment() -> dict[str, str]:
    """This process's environment without what would let another Python find
    this one's packages (``PYTHONPATH``, ``PYSPARK_*``): what the cluster's
    processes, and so the executors' Python workers, start with."""
    hidden = ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    return {key: value for key, value in os.environ.items() if key not in hidden}


#: The ports the README's cluster commands use: the master, its web UI and the
#: two workers' web UIs.
README_PORTS = (7077, 8080, 8081, 8082)


def readme_cluster_commands(readme: str) -> list[str]:
    """The README's cluster commands as written: the indented block of its "On
    a cluster" section that starts a master (comments included)."""
    section = readme.split("### On a cluster", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"(?:^    .*\n)+", section, flags=re.M):
        if "deploy.master.Master" in block:
            return [line[4:] for line in block.splitlines()]
    raise ValueError("expected a block starting a master in the README's 'On a cluster'")


def readme_cluster_script(
    commands: Sequence[str],
    ports: Mapping[int, int],
    outs: Sequence[str] = (),
    check_arguments: Sequence[str] = (),
) -> str:
    """``commands`` (:func:`readme_cluster_commands`) as one bash script with
    each of :data:`README_PORTS` replaced by ``ports[port]``, the n-th
    ``--out out/cluster`` by ``outs[n]`` where given, and ``check_arguments``
    appended to the ``cowstate check`` command."""
    pattern = re.compile(r"\b(" + "|".join(str(port) for port in README_PORTS) + r")\b")
    lines, out = [], 0
    for line in commands:
        line = pattern.sub(lambda m: str(ports[int(m.group(1))]), line)
        if "--out out/cluster" in line:
            if out < len(outs):
                line = line.replace("--out out/cluster", f"--out {shlex.quote(outs[out])}")
            out += 1
        if "cowstate check " in line and check_arguments:
            line += "".join(f" {shlex.quote(argument)}" for argument in check_arguments)
        lines.append(line)
    return "\n".join(lines) + "\n"
