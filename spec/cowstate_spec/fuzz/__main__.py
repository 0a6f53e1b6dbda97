"""``python -m cowstate_spec.fuzz``: see :mod:`cowstate_spec.fuzz.cli`."""

from cowstate_spec.fuzz.cli import main

raise SystemExit(main())
