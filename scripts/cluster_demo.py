"""``make cluster-demo``: cowstate check on a Spark standalone cluster on loopback.

Builds the executors' Python (``build/executor-python``: pyarrow only, no
cowstate), starts a master and two workers from the installed pyspark
(:class:`cowstate_spec.local_cluster.LocalCluster`, with that Python as
``spark.pyspark.python`` in the cluster's ``spark-defaults.conf``), runs the
README's two commands against it -- ``cowstate check`` and ``spark-submit
scripts/cowstate_check.py`` -- printing their reports, and stops the master
and the workers by their process ids.

    python scripts/cluster_demo.py [--preset NAME] [--workloads N] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from cowstate_spec.local_cluster import LocalCluster, executor_python

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--workloads", type=int)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "cluster")
    args = parser.parse_args()
    started = time.perf_counter()
    python = executor_python(ROOT / "build" / "executor-python")
    print(f"executors' Python: {python} (pyarrow only)", flush=True)
    venv = Path(sys.executable).parent
    check = ["check", "--preset", args.preset]
    if args.workloads:
        check += ["--workloads", str(args.workloads)]
    with LocalCluster(workers=2, defaults={"spark.pyspark.python": str(python)}) as cluster:
        pids = [process.pid for process in cluster.processes]
        print(f"cluster: {cluster.master}, 2 workers x 1 core (pids {pids})")
        commands = {
            "cowstate check": [str(venv / "cowstate"), *check, "--master", cluster.master],
            "spark-submit": [
                str(venv / "spark-submit"),
                "--master",
                cluster.master,
                "--conf",
                f"spark.pyspark.driver.python={sys.executable}",
                str(ROOT / "scripts" / "cowstate_check.py"),
                *check,
            ],
        }
        status = 0
        for name, command in commands.items():
            out = args.out / name.replace(" ", "-")
            print(f"\n$ {' '.join(command)} --out {out}", flush=True)
            env = {**cluster.environment(), "PYSPARK_DRIVER_PYTHON": sys.executable}
            result = subprocess.run([*command, "--out", str(out)], env=env, cwd=ROOT, check=False)
            status = max(status, result.returncode)
    print(f"\ncluster stopped; {time.perf_counter() - started:.0f} s in all")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
