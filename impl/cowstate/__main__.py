"""``python -m cowstate``: the ``cowstate`` command (see :mod:`cowstate.cli`)."""

from cowstate.cli import main

raise SystemExit(main())
