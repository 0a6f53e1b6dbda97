"""cowstate_spec: the specification of cowstate as code.

State machines (need the ``dev`` extra: Hypothesis):

- :mod:`cowstate_spec.machine`: maps and tables against the reference model,
  side by side, with the key-group rules for tables;
- :mod:`cowstate_spec.backend_machine`: keyed state backends against the
  reference backend, asynchronous writers racing the owner;
- :mod:`cowstate_spec.storage_machine`: jobs, checkpoints, savepoints, restore
  modes, injected faults and crashes against the reference storage;
- :mod:`cowstate_spec.strategies`: Hypothesis strategies and the machine's helpers;
- :mod:`cowstate_spec.profiles`: the Hypothesis profiles.

What the machines and the differential run check:

- :mod:`cowstate_spec.implementations`: ``IMPLEMENTATIONS`` and ``TABLE_TYPES``, every
  map and table, with their capabilities;
- :mod:`cowstate_spec.backends`: ``BACKENDS``, every keyed state backend, and
  the ``WriteGate`` that interleaves writers with the owner;
- :mod:`cowstate_spec.kinds`: ``KINDS``, every kind of keyed state as the
  machines drive it (the state they register, the backend machine's rules);
- :mod:`cowstate_spec.invariants`: the structural checkers and snapshot fingerprints;
- :mod:`cowstate_spec.contract`: what callers do with the states they get;
- :mod:`cowstate_spec.keys`: keys with chosen hashes (collisions, long chains);
- :mod:`cowstate_spec.hostile`: user code that raises (rule U): probe keys,
  states whose copy raises, states too deep to copy, transform functions that
  mutate then raise; probe keys whose ``__eq__`` changes the map (rule R);
- :mod:`cowstate_spec.collected`: tracked states, and the map machines' check
  that a state nothing holds any more has no reference left;
- :mod:`cowstate_spec.bad_implementations`: one-line bugs the spec must catch;
- :mod:`cowstate_spec.bad_checks`: restore checks broken to sample or to count,
  which the restore tests must catch.

The differential run (``cowstate check``; Spark needs the ``spark`` extra):

- :mod:`cowstate_spec.workloads`: workload specs and the operation generator;
- :mod:`cowstate_spec.differential`: one workload, an implementation against the
  model, minimized divergences;
- :mod:`cowstate_spec.spark_job`: the run on Spark (or in process);
- :mod:`cowstate_spec.spark_env`: starting Spark (master URLs, Java, a quiet
  driver JVM, the executors' Python) and stopping it;
- :mod:`cowstate_spec.interrupt`: Ctrl-C, whenever it comes: one line, status
  130, Spark stopped;
- :mod:`cowstate_spec.shipping`: the archive that ships the checker to executors;
- :mod:`cowstate_spec.progress`: progress per finished workload;
- :mod:`cowstate_spec.local_cluster`: the README's cluster commands as a script (tests, demo);
- :mod:`cowstate_spec.cli`: the ``check`` command (registered for ``cowstate.cli``
  under the entry point group ``cowstate.commands``).

Symbolic checks (CrossHair, ``dev`` extra):

- :mod:`cowstate_spec.symbolic`: runs ``crosshair check`` and ``diffbehavior``;
- :mod:`cowstate_spec.equivalences`: each fast helper beside its plain version;
- :mod:`cowstate_spec.bad_arithmetic`: arithmetic bugs CrossHair must refute.

Importing a module that needs a missing extra raises ``ModuleNotFoundError``
naming the extra to install (see :class:`MissingExtraFinder`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtraFinder"]

#: Third-party packages some modules of the specification need, by the extra
#: of the ``cowstate`` distribution that installs them.
EXTRAS = {
    "hypothesis": "dev",
    "hypothesis_crosshair": "dev",
    "crosshair": "dev",
    "pyspark": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "rich": "spark",
}


class MissingExtraFinder:
    """The last import finder: a missing package of :data:`EXTRAS` fails with a
    message naming the extra, instead of a bare ``No module named ...``."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        top = name.partition(".")[0]
        extra = EXTRAS.get(top)
        if extra is None:
            return None
        raise ModuleNotFoundError(
            f"No module named {top!r}: this part of cowstate_spec needs the {extra!r} extra; "
            f"install it with: pip install 'cowstate[{extra}]'",
            name=name,
        )


if not any(isinstance(finder, MissingExtraFinder) for finder in sys.meta_path):
    sys.meta_path.append(MissingExtraFinder())
