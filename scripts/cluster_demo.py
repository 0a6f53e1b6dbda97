"""``make cluster-demo``: the README's cluster commands, exactly, on free ports.

Reads the commands of the README's "On a cluster" section
(:func:`cowstate_spec.local_cluster.readme_cluster_commands`) and runs them as
one bash script in the checkout, echoing each line as it runs (``bash -v``),
with only the ports replaced by free ones
(:func:`~cowstate_spec.local_cluster.readme_cluster_script`): build the
executors' Python (``build/executor-python``, the driver's Python version and
pyarrow, no cowstate) and the cluster's configuration, start a master and two
workers from the installed pyspark, run ``cowstate check`` and the same through
``spark-submit scripts/cowstate_check.py``, stop the master and the workers.
Whatever the script leaves running (it stopped early) is stopped with it: it
runs in a process group of its own.

    python scripts/cluster_demo.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from cowstate_spec.local_cluster import (
    README_PORTS,
    free_port,
    readme_cluster_commands,
    readme_cluster_script,
)

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    started = time.perf_counter()
    commands = readme_cluster_commands((ROOT / "README.md").read_text())
    ports = {port: free_port() for port in README_PORTS}
    print(f"the README's cluster commands, ports {ports} (README: its own)\n", flush=True)
    script = readme_cluster_script(commands, ports)
    process = subprocess.Popen(["bash", "-v", "-c", script], cwd=ROOT, start_new_session=True)
    try:
        status = process.wait()
    finally:
        for stop in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, stop)  # whatever of the cluster is left
            except ProcessLookupError:
                break
            time.sleep(5)
    print(f"\ncluster stopped; {time.perf_counter() - started:.0f} s in all")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
