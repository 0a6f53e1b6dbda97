"""Driver script for spark-submit: ``spark-submit [options] scripts/cowstate_check.py check ...``.

Under spark-submit the master comes from spark-submit's ``--master``; the
command's own ``--master`` is then ignored.
"""

from cowstate_spec.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
