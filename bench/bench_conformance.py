"""Benchmark of checking an implementation through the process protocol.

Method
------
1. **The protocol's cost.** The C map checked in this process (``c-map``)
   and the same map behind the protocol (``cmap-process``, the reference
   adapter): the first ``--workloads`` workloads of the ``smoke`` preset
   through ``run_workload`` (a warm-up workload first), divided by the CPU
   seconds spent -- this thread's, plus the child's (read from ``/proc``)
   for the protocol. Reported: checked operations per CPU second each way
   and their ratio. Target: the protocol keeps at least 25% of the
   in-process rate (**PROTOCOL_TARGET**), so a 10^8-operation run of an
   external map is an evening on a small cluster.
2. **Flink's composite hash** (``--flink``, after ``make flink-adapter``):
   ``--puts`` puts of pairs whose key equals their namespace, then as many
   whose namespace is one constant, straight through the protocol (no
   model), into Flink's map and into the C map. Flink hashes a pair as
   ``bitMix(key.hashCode() ^ namespace.hashCode())``: every pair with key ==
   namespace has the hash ``bitMix(0)``, one chain, so its puts grow
   quadratically; cowstate's composite hash mixes the two. Reported: seconds
   per 1,000 puts each way.
"""

from __future__ import annotations

import argparse
import time

from cowstate_spec.differential import run_workload
from cowstate_spec.implementations import by_name
from cowstate_spec.process_impl import _child
from cowstate_spec.workloads import operations, preset

PROTOCOL_TARGET = 0.25


def checked_rate(name: str, workloads: int) -> float:
    """Checked operations per CPU second (this thread and the child's)."""
    spec = preset("smoke")
    implementation = by_name(name)
    run_workload(
        implementation,
        operations(spec, workloads),
        check_every=spec.check_every,
        initial_capacity=spec.initial_capacity,
    )
    checked = 0
    cpu = 0.0
    for index in range(workloads):
        result = run_workload(
            implementation,
            operations(spec, index),
            check_every=spec.check_every,
            initial_capacity=spec.initial_capacity,
        )
        assert not result.diverged, (name, index, result.expected, result.actual)
        checked += result.applied
        cpu += result.cpu
    return checked / cpu


def put_seconds(name: str, puts: int, same: bool) -> float:
    """Wall seconds of ``puts`` puts through the protocol (key == namespace if ``same``)."""
    child = _child(name)
    child.request([["create", 4]])
    ops = [["put", i, i if same else 0, i] for i in range(puts)]
    started = time.perf_counter()
    for start in range(0, puts, 256):
        child.request(ops[start : start + 256])
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", type=int, default=40)
    parser.add_argument("--flink", action="store_true", help="Flink's map too (make flink-adapter)")
    parser.add_argument("--puts", type=int, default=20_000)
    args = parser.parse_args()

    in_process = checked_rate("c-map", args.workloads)
    protocol = checked_rate("cmap-process", args.workloads)
    ratio = protocol / in_process
    print(f"Checked operations per CPU second, smoke preset, {args.workloads} workloads")
    print(f"  c-map in this process      {in_process:>12,.0f}")
    print(f"  c-map through the protocol {protocol:>12,.0f}")
    met = "met" if ratio >= PROTOCOL_TARGET else "NOT met"
    print(f"  ratio {ratio:.0%} (target >= {PROTOCOL_TARGET:.0%}: {met})")
    if not args.flink:
        return 0
    print(f"\nPuts through the protocol, {args.puts:,} pairs (seconds per 1,000 puts)")
    for name in ("cmap-process", "flink-java"):
        same = put_seconds(name, args.puts, same=True)
        other = put_seconds(name, args.puts, same=False)
        print(
            f"  {name:<14} key == namespace {same / args.puts * 1000:8.4f}   "
            f"namespace constant {other / args.puts * 1000:8.4f}   ({same / other:,.1f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
