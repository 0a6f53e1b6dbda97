"""The reference adapter: cowstate's C map behind the process protocol.

``python -m cowstate_spec.adapters.cmap`` serves ``docs/protocol.md`` for
the C map (the pure map where it was not built) with everything the
protocol can carry: state handles, the rehash's progress, and the
structural checker of :mod:`cowstate_spec.invariants` run in the child on
the map and the fingerprints of its open snapshots. ``--implementation
NAME`` serves any map the spec names instead (``cow-map``, a planted bug
such as ``bad-get-skips-state-copy``), so the runner's catches through the
protocol are the in-process runner's.

It is the protocol's reference: the differential suite runs through it
against an implementation known to agree with the model
(``tests/test_process_protocol.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from cowstate_spec.adapters.serve import serve
from cowstate_spec.cmap_view import MAP_CLASSES, rehash_progress
from cowstate_spec.implementations import C_MAP, by_name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cowstate_spec.adapters.cmap", description=__doc__.splitlines()[0]
    )
    default = "c-map" if C_MAP is not None else "cow-map"
    parser.add_argument(
        "--implementation",
        default=default,
        metavar="NAME",
        help=f"a map the spec names (default: {default})",
    )
    args = parser.parse_args(argv)
    implementation = by_name(args.implementation)
    sample = implementation.create()
    visible = isinstance(sample, MAP_CLASSES)
    capabilities = implementation.capabilities
    implementation.close(sample)

    def factory(initial_capacity: int | None = None) -> Any:
        return implementation.create(initial_capacity)

    return serve(
        factory,
        name=f"cowstate {args.implementation}",
        capabilities={
            "snapshots": capabilities.snapshots,
            "put_reports_insert": capabilities.put_reports_insert,
            "mutations_persist": capabilities.mutations_persist,
            "fail_fast": capabilities.fail_fast,
            "state_handles": True,
            "rehash_visible": visible,
            "check": implementation.check is not None,
        },
        refusals=capabilities.refusals,
        concurrent_modification=capabilities.concurrent_modification,
        rehash=rehash_progress if visible else None,
        check=implementation.check,
        fingerprint=implementation.fingerprint,
    )


if __name__ == "__main__":
    sys.exit(main())
