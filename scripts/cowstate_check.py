"""Driver script for spark-submit: ``spark-submit [options] scripts/cowstate_check.py check ...``.

Under spark-submit the master, the configuration and the Python are
spark-submit's (the command's own ``--master`` and ``--conf`` are not used);
the summary records the master the job ran on. The executors need no
cowstate: the run ships it (``cowstate_spec.shipping``). See the README's
"On a cluster" for the exact command.
"""

from cowstate_spec.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
