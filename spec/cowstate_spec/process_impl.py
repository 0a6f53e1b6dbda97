"""Implementations in any language: a child process speaking the protocol.

``cowstate check --implementation process:'COMMAND'`` (or an adapter's name
in :data:`ADAPTERS`: ``cmap-process``, ``flink-java``) checks a map that
lives in a child process and speaks ``docs/protocol.md`` on its standard
streams. The model stays here; the differential runner's workloads go to
the child in batches and its results come back, checked as the in-process
runner checks a Python map (:mod:`cowstate_spec.differential`).

How the runner works (the rules are cited in the code):

1. **One child per worker.** A child is started on first use (the spec's
   validation on the driver, a task on an executor), greets (the hello
   negotiates the version and says what the implementation offers: its
   capabilities) and is reused by every workload of that Python process;
   each workload starts with ``create``. It ends when its standard input
   closes.
2. **Batches.** A workload's operations do not depend on the results, so
   the runner sends them :data:`BATCH` to a line and reads one line of
   results (and the map's size after each), instead of a round trip per
   operation. Snapshot ids are the runner's, so a release needs no answer
   first. The structure and the open snapshots are read at the runner's
   ``check_every`` cadence (``snapshots``, ``check``).
3. **The same judgement.** Every result and every size against the
   model's; snapshots at release and every ``check_every``; an interrupted
   iteration by the rules of :mod:`cowstate_spec.differential` (without a
   visible rehash, going on is allowed where no mapping came or went, and
   must then yield exactly the rest).
4. **State identity across the boundary.** Each state a result carries
   comes with a handle. For a mutable state (list, dict) the runner tracks
   the handle of the stored object of each mapping and the snapshot count
   when it was stored: a state handed out (``get``, an old state, the
   argument of a transform function) must be the stored object while no
   snapshot was taken since it was stored (no copy before a snapshot), and
   a different one -- the copy -- while an open snapshot taken since holds
   it (rule S); the copy is then the stored object (one copy per state).
5. **Failures are one line.** A child that cannot start, dies, stops
   answering within :data:`TIMEOUT` seconds, answers garbage or speaks
   another version raises :class:`~cowstate_spec.protocol.ProtocolError`
   naming the implementation -- an error of the run, never a divergence.
   An operation the child reports ``crashed`` is a divergence (with its
   traceback), as an exception inside a Python implementation is.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cowstate_model import ReferenceStateMap
from cowstate_spec import contract as c
from cowstate_spec.contract import TRANSFORMS
from cowstate_spec.differential import (
    FAILED_FAST,
    SNAPSHOT_IN_REHASH,
    SNAPSHOT_IN_REHASH_LATE,
    SNAPSHOT_IN_REHASH_STARTED,
    WENT_ON,
    Divergence,
)
from cowstate_spec.implementations import Capabilities, Implementation
from cowstate_spec.keys import HashKey
from cowstate_spec.protocol import (
    CAPABILITY_DEFAULTS,
    MUTATION_ITEM,
    VERSION,
    ProtocolError,
    key_from_wire,
    key_to_wire,
    state_to_wire,
)

__all__ = [
    "ADAPTERS",
    "BATCH",
    "TIMEOUT",
    "ProcessImplementation",
    "flink_adapter_command",
    "is_process_name",
    "process_implementation",
]

#: Protocol operations per request line (rule 2).
BATCH = 256
#: Seconds a child may take to answer one line (``COWSTATE_PROTOCOL_TIMEOUT``).
TIMEOUT = float(os.environ.get("COWSTATE_PROTOCOL_TIMEOUT", "300"))
#: Where ``make flink-adapter`` builds the Java adapter (``COWSTATE_FLINK_ADAPTER``).
FLINK_ADAPTER_DIR = Path(
    os.environ.get(
        "COWSTATE_FLINK_ADAPTER", Path(__file__).resolve().parents[2] / "build" / "flink-adapter"
    )
)
FLINK_ADAPTER_CLASS = "org.apache.flink.runtime.state.heap.CowstateFlinkAdapter"

#: The adapters ``--implementation`` knows by name (``{python}``: this Python).
ADAPTERS: dict[str, str] = {
    "cmap-process": "{python} -m cowstate_spec.adapters.cmap",
    "flink-java": "(make flink-adapter)",
}

_MUTABLE = (list, dict)


def is_process_name(name: str) -> bool:
    """True for ``process:COMMAND`` and the names of :data:`ADAPTERS`."""
    return name.startswith("process:") or name in ADAPTERS


def process_implementation(name: str) -> ProcessImplementation:
    """The implementation behind ``name`` (``process:COMMAND`` or an adapter's
    name), its child started and greeted if this process has none yet."""
    child = _child(name)
    return ProcessImplementation(
        name,
        _no_factory,
        capabilities=child.capabilities,
        command=tuple(child.argv),
        state_handles=child.features["state_handles"],
        rehash_visible=child.features["rehash_visible"],
        self_check=child.features["check"],
        description=child.description,
    )


def flink_adapter_command() -> list[str]:
    """The command that runs the Java adapter of Flink's map, or ProtocolError
    saying how to build it."""
    classes = FLINK_ADAPTER_DIR / "classes"
    jars = sorted((FLINK_ADAPTER_DIR / "lib").glob("flink-dist-*.jar"))
    if (
        not (classes / FLINK_ADAPTER_CLASS.replace(".", "/")).with_suffix(".class").is_file()
        or not jars
    ):
        raise ProtocolError(
            f"implementation flink-java is not built: expected the adapter's classes and "
            f"flink-dist jar in {FLINK_ADAPTER_DIR}; run `make flink-adapter` (needs Java 17 "
            "and network access to PyPI)"
        )
    return [
        "java",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=4",
        "-Xmx1g",
        "-cp",
        os.pathsep.join([str(classes), str(jars[-1])]),
        FLINK_ADAPTER_CLASS,
    ]


def _no_factory(initial_capacity: int | None = None) -> Any:
    raise ProtocolError(
        "a process implementation runs through the protocol only (cowstate check, "
        "run_workload), not as a Python object"
    )


@dataclass(frozen=True)
class ProcessImplementation(Implementation):
    """A map in a child process (see the module doc); ``capabilities`` and the
    protocol's extras are what its hello said."""

    command: tuple[str, ...] = ()
    state_handles: bool = True
    rehash_visible: bool = False
    self_check: bool = False
    description: str = ""

    def pair(
        self, ops: Sequence[tuple[Any, ...]], initial_capacity: int | None, check_every: int
    ) -> ProcessPair:
        """The runner's side of one workload (used by ``run_workload``)."""
        return ProcessPair(self, ops, initial_capacity, check_every)

    def skipped_process_checks(self) -> list[str]:
        """What the protocol could carry but this implementation does not."""
        skipped = []
        if not self.state_handles or not self.capabilities.mutations_persist:
            skipped.append(
                "state identity (no copy before a snapshot, one copy per state after it): "
                "no state handles"
            )
        if not self.self_check:
            skipped.append("structural invariants (the implementation checks none of its own)")
        if not self.rehash_visible:
            skipped.append(
                "the fail-fast rule for rehash steps and the count of snapshots taken in a "
                "rehash (the rehash is not visible)"
            )
        return skipped


# ------------------------------------------------------------------ the child


class Child:
    """One child process speaking the protocol (rules 1 and 5)."""

    def __init__(self, label: str, argv: list[str]) -> None:
        self.label = label
        self.argv = argv
        self.number = 0
        self._pending: list[bytes] = []
        # Read back only when the child dies (its last line names the cause).
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env
            )
        except OSError as exc:
            raise ProtocolError(
                f"implementation {label}: cannot start {argv[0]!r} ({exc.strerror or exc})"
            ) from None
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin
        self._out = self.process.stdout.fileno()
        answer = self.exchange({"hello": {"protocol": [VERSION], "client": "cowstate"}})
        if "error" in answer:
            raise ProtocolError(f"implementation {label} refused a request: {answer['error']}")
        hello = answer.get("hello")
        if not isinstance(hello, dict):
            raise ProtocolError(
                f"implementation {label} answered the hello without a hello; expected "
                f'{{"hello": {{"protocol": {VERSION}, ...}}}}'
            )
        if hello.get("protocol") != VERSION:
            raise ProtocolError(
                f"implementation {label} speaks protocol version {hello.get('protocol')!r}, "
                f"expected {VERSION}"
            )
        offered = hello.get("capabilities") or {}
        unknown = sorted(set(offered) - set(CAPABILITY_DEFAULTS))
        if unknown or not all(isinstance(v, bool) for v in offered.values()):
            raise ProtocolError(
                f"implementation {label} offered capabilities {offered!r}; expected booleans "
                f"among {sorted(CAPABILITY_DEFAULTS)}"
            )
        self.features = {**CAPABILITY_DEFAULTS, **offered}
        self.description = str(hello.get("implementation", label))
        self.capabilities = Capabilities(
            snapshots=self.features["snapshots"],
            put_reports_insert=self.features["put_reports_insert"],
            mutations_persist=self.features["mutations_persist"],
            fail_fast=self.features["fail_fast"],
            # The child's objects are out of this process's reach: no state
            # lifetimes to watch (cowstate_spec.collected), a skipped check.
            frees_states=False,
        )

    def request(self, ops: list[list[Any]]) -> tuple[list[Any], list[int]]:
        """Send one batch; its results and sizes (rule 2)."""
        answer = self.exchange({"ops": ops})
        results, sizes = answer.get("results"), answer.get("sizes")
        if "error" in answer:
            raise ProtocolError(f"implementation {self.label} refused a request: {answer['error']}")
        if (
            not isinstance(results, list)
            or not isinstance(sizes, list)
            or len(results) != len(sizes)
            or not 0 < len(results) <= len(ops)
        ):
            raise ProtocolError(
                f"implementation {self.label} answered {len(ops)} operations with "
                f"{_clip(json.dumps(answer))}; expected results and sizes, one per operation"
            )
        if len(results) < len(ops) and not _crashed(results[-1]):
            raise ProtocolError(
                f"implementation {self.label} answered {len(results)} of {len(ops)} operations "
                "without a crashed result ending them"
            )
        return results, sizes

    def exchange(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Write one request line, read and parse the answer (rule 5)."""
        self.number += 1
        line = json.dumps({"id": self.number, **payload}, separators=(",", ":")) + "\n"
        try:
            self._in.write(line.encode())
            self._in.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None
        raw = self._read_line()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("id") != self.number:
            if isinstance(answer, dict) and "error" in answer:
                raise ProtocolError(
                    f"implementation {self.label} refused a request: {answer['error']}"
                )
            raise ProtocolError(
                f"implementation {self.label} answered {_clip(raw.decode(errors='replace'))}; "
                f"expected a JSON protocol line with id {self.number}"
            )
        return answer

    def cpu_seconds(self) -> float:
        """The child's CPU time so far (Linux; 0 elsewhere)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self, wait: float = 5.0) -> None:
        """Close its standard input (it exits), waiting ``wait`` seconds before a kill."""
        with contextlib.suppress(OSError):
            self._in.close()
        try:
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()

    def _read_line(self) -> bytes:
        chunks = self._pending
        while True:
            if chunks and b"\n" in chunks[-1]:
                break
            ready, _, _ = select.select([self._out], [], [], TIMEOUT)
            if not ready:
                raise ProtocolError(
                    f"implementation {self.label} did not answer within {TIMEOUT:g} s "
                    "(COWSTATE_PROTOCOL_TIMEOUT)"
                )
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                raise self._died()
            chunks.append(chunk)
        data = b"".join(chunks)
        line, _, rest = data.partition(b"\n")
        self._pending = [rest] if rest else []
        return line

    def _died(self) -> ProtocolError:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return ProtocolError(f"implementation {self.label} closed its standard output")
        self._stderr.seek(0)
        lines = [line.strip() for line in self._stderr.read().decode(errors="replace").splitlines()]
        last = next((line for line in reversed(lines) if line), "")
        said = f" (its last line on stderr: {_clip(last)})" if last else ""
        return ProtocolError(f"implementation {self.label} exited with status {code}{said}")


#: This process's children by name (rule 1).
_CHILDREN: dict[str, Child] = {}


def _child(name: str) -> Child:
    child = _CHILDREN.get(name)
    if child is not None and child.process.poll() is None:
        return child
    if child is not None:
        raise child._died()
    argv = _command(name)
    child = Child(name, argv)
    _CHILDREN[name] = child
    return child


def _command(name: str) -> list[str]:
    if name == "flink-java":
        return flink_adapter_command()
    text = ADAPTERS.get(name) or name.removeprefix("process:")
    try:
        argv = [word.replace("{python}", sys.executable) for word in shlex.split(text)]
    except ValueError as exc:
        raise ProtocolError(f"implementation {name}: cannot split the command ({exc})") from None
    if not argv:
        raise ProtocolError(f"implementation {name}: expected a command after 'process:', got none")
    return argv


@atexit.register
def _close_children() -> None:
    while _CHILDREN:
        _, child = _CHILDREN.popitem()
        child.close()


def forget(name: str) -> None:
    """Stop the child of ``name`` (tests; the next use starts a new one)."""
    child = _CHILDREN.pop(name, None)
    if child is not None:
        child.close(wait=0.2)


# ------------------------------------------------------------------ the runner


class ProcessPair:
    """The model and a process implementation, one workload (rules 2-4); the
    interface of the in-process pair that ``run_workload`` drives."""

    def __init__(
        self,
        implementation: ProcessImplementation,
        ops: Sequence[tuple[Any, ...]],
        initial_capacity: int | None,
        check_every: int,
    ) -> None:
        self.implementation = implementation
        self.child = _child(implementation.name)
        self.model = ReferenceStateMap()
        self.events: Counter[str] = Counter()
        self.capabilities = implementation.capabilities
        self.identity = implementation.state_handles and self.capabilities.mutations_persist
        self.cpu_started = self.child.cpu_seconds()
        self.child_cpu = 0.0
        self.open: list[tuple[int, Any]] = []  # (snapshot number, model snapshot)
        self.taken = 0  # snapshots taken so far; a snapshot's number is the count after it
        self.stored: dict[tuple[Any, Any], tuple[Any, int]] = {}  # rule 4: (handle, taken)
        self._requests = self._generate(ops, initial_capacity, check_every)
        self._results: deque[Any] = deque()
        self._sizes: deque[int] = deque()
        self.last_size = -1
        self._created = False

    # --- run_workload's interface

    def apply(self, op: tuple[Any, ...], step: int) -> None:
        name = op[0]
        if name in ("snapshot", "release") and not self.capabilities.snapshots:
            return
        if name == "release" and not self.open:
            return
        if name == "interrupt_iteration" and not self.capabilities.fail_fast:
            self._judge(_keyed(op), self._next_result())
        else:
            self._judge(op, self._next_result())
        size = self.last_size
        if size != len(self.model):
            raise Divergence(f"size {len(self.model)}", f"size {size}")

    def check_all(self) -> None:
        if self.capabilities.snapshots:
            self._compare_open(self._next_result())
        if self.implementation.self_check:
            verdict = self._next_result()
            if verdict is not None:
                raise Divergence("all structural invariants", _message(verdict))

    def finish(self) -> None:
        """Nothing to watch at the end: the child's states are out of reach
        (``frees_states`` is false, a skipped check)."""

    def close(self) -> None:
        for _, model in self.open:
            model.release()
        self.child_cpu = max(0.0, self.child.cpu_seconds() - self.cpu_started)

    # --- requests (rule 2)

    def _generate(
        self, ops: Sequence[tuple[Any, ...]], initial_capacity: int | None, check_every: int
    ) -> Iterator[list[Any]]:
        yield ["create", initial_capacity]
        snapshots, fail_fast = self.capabilities.snapshots, self.capabilities.fail_fast
        check = self.implementation.self_check
        open_ids: list[int] = []
        number = 0
        for position, op in enumerate(ops):
            name = op[0]
            if name == "snapshot":
                if snapshots:
                    number += 1
                    open_ids.append(number)
                    yield ["snapshot", number]
            elif name == "release":
                if snapshots and open_ids:
                    yield ["release", open_ids.pop(op[1] % len(open_ids))]
            elif name == "interrupt_iteration":
                keyed = _request(_keyed(op))
                yield ["interrupt_iteration", op[1], keyed] if fail_fast else keyed
            else:
                yield _request(op)
            if check_every and (position + 1) % check_every == 0:
                yield from _checks(snapshots, check)
        yield from _checks(snapshots, check)

    def _next_result(self) -> Any:
        if not self._results:
            batch = [op for _, op in zip(range(BATCH), self._requests, strict=False)]
            if not batch:
                raise ProtocolError(f"implementation {self.implementation.name}: no request left")
            results, sizes = self.child.request(batch)
            self._results.extend(results)
            self._sizes.extend(sizes)
        result = self._results.popleft()
        self.last_size = self._sizes.popleft()
        if type(result) is dict and result.get("error") == "crashed":
            raise Divergence("no exception", str(result.get("message")))
        if not self._created:  # the result of create
            self._created = True
            return self._next_result()
        return result

    # --- judgement (rules 3 and 4)

    def _judge(self, op: tuple[Any, ...], result: Any) -> None:
        name = op[0]
        model = self.model
        if name == "put":
            kn, state = (op[1], op[2]), op[3]
            expected = model.put(op[1], op[2], copy.deepcopy(state))
            inserted, handle = _pair(result, name)
            if self.capabilities.put_reports_insert:
                if inserted is not expected:
                    raise Divergence(repr(expected), repr(inserted))
            elif inserted is not None:
                raise Divergence("None", repr(inserted))
            self._store(kn, handle, state)
        elif name in ("get", "get_and_mutate"):
            kn = (op[1], op[2])
            expected = model.get(*kn)
            if name == "get_and_mutate" and expected is not None:
                if self.capabilities.mutations_persist:
                    c.mutate_in_place(expected, op[3])
                else:
                    expected = copy.deepcopy(expected)
                    c.mutate_in_place(expected, op[3])
            handle = self._held(result, expected, name)
            if expected is not None:
                self._handed_out(kn, handle, expected, name)
                self._store(kn, handle, expected)
        elif name == "contains_key":
            expected = model.contains_key(op[1], op[2])
            if result is not expected:
                raise Divergence(repr(expected), repr(result))
        elif name == "put_and_get_old":
            kn = (op[1], op[2])
            old = model.put_and_get_old(op[1], op[2], copy.deepcopy(op[3]))
            if old is not None:
                c.mutate_in_place(old, MUTATION_ITEM)
            got, handle = _pair(result, name)
            old_handle = self._held(got, old, name)
            if old is not None:
                self._handed_out(kn, old_handle, old, name)
            self._store(kn, handle, op[3])
        elif name == "remove":
            model.remove(op[1], op[2])
            if result is not None:
                raise Divergence("None", repr(result))
            self.stored.pop((op[1], op[2]), None)
        elif name == "remove_and_get_old":
            kn = (op[1], op[2])
            old = model.remove_and_get_old(*kn)
            if old is not None:
                c.mutate_in_place(old, MUTATION_ITEM)
            handle = self._held(result, old, name)
            if old is not None:
                self._handed_out(kn, handle, old, name)
            self.stored.pop(kn, None)
        elif name == "transform":
            self._transform(op, result)
        elif name == "snapshot":
            self._count_snapshot(result)
            self.taken += 1
            self.open.append((self.taken, model.snapshot()))
        elif name == "release":
            _, snapshot = self.open.pop(op[1] % len(self.open))
            self._compare(f"snapshot {snapshot.version}", result, snapshot.contents)
            snapshot.release()
        elif name == "iterate":
            self._compare("the map", result, c.snapshot_contents(model))
        elif name == "keys":
            got = Counter(_wire_key(key_from_wire(k)) for k in _list(result, name))
            expected_keys = Counter(_wire_key(k) for k in model.keys(op[1]))
            if got != expected_keys:
                raise Divergence(repr(expected_keys), repr(got))
        elif name == "interrupt_iteration":
            self._interrupted(op, result)
        else:
            raise ValueError(f"expected a workload operation, got {name!r}")

    def _transform(self, op: tuple[Any, ...], result: Any) -> None:
        kn = (op[1], op[2])
        before = self.model.get(*kn)
        try:
            self.model.transform(op[1], op[2], op[3], TRANSFORMS[op[4]])
            refused = False
        except ReferenceStateMap.Error:
            refused = True
        if _refused(result) != refused:
            raise Divergence(
                "a refusal" if refused else "a transformed state", _message(result) or repr(result)
            )
        if refused:
            return
        received, handle = _pair(result, "transform")
        if before is not None:
            self._handed_out(kn, received, before, "transform (the function's argument)")
        self._store(kn, handle, self.model.get(*kn))

    def _interrupted(self, op: tuple[Any, ...], result: Any) -> None:
        """Rule 3 for ``interrupt_iteration`` (the rules of
        :meth:`cowstate_spec.differential._Pair.interrupt_iteration`)."""
        _, taken, keyed, key, namespace, _ = op
        if not isinstance(result, list) or len(result) != 5:
            raise Divergence("[seen, result, rehashing, step, rest]", _clip(repr(result)))
        seen_entries, keyed_result, rehashing, step, rest = result
        before = self._contents(c.snapshot_contents(self.model))
        seen = self._entries(seen_entries, "the iteration")
        if len(seen_entries) != taken % (len(before) + 1):
            raise Divergence(
                f"{taken % (len(before) + 1)} mappings before the {keyed}",
                f"{len(seen_entries)}: {_clip(repr(seen_entries))}",
            )
        if any(before.get(k, _ABSENT) != v for k, v in seen.items()):
            raise Divergence(f"mappings of {before!r}", f"iteration yielded {seen!r}")
        size = len(self.model)
        self._judge(_keyed(op), keyed_result)
        changed = len(self.model) != size
        if step == "failed":
            if not changed and rehashing is False:
                raise Divergence(
                    f"the iteration going on after {keyed}, which changed no mapping "
                    "outside a rehash",
                    "a fail-fast error",
                )
            self.events[FAILED_FAST] += 1
            return
        if changed or rehashing is True:
            why = "a mapping was added or removed" if changed else "a rehash step"
            raise Divergence(
                f"a fail-fast error at the step after {keyed} ({why})",
                f"the iteration went on with {step!r}",
            )
        steps = [] if step == "end" else [step, *rest]
        if "failed" in steps:
            raise Divergence(
                "the rest of the iteration", f"a fail-fast error after it went on: {rest!r}"
            )
        got = self._entries(steps, "the rest of the iteration")
        now = self._contents(c.snapshot_contents(self.model))
        expected = {k: v for k, v in now.items() if k not in seen}
        kn = _wire_kn(key, namespace)
        if kn in got and _same(got[kn], before.get(kn, _ABSENT)):
            expected[kn] = got[kn]  # the replaced state, from the chain a snapshot shares
        if not _same(got, expected) or seen.keys() - now.keys():
            raise Divergence(f"the rest of the iteration {expected!r}", repr(got))
        self.events[WENT_ON] += 1

    def _count_snapshot(self, rehash: Any) -> None:
        if not isinstance(rehash, list):
            return
        r, capacity = rehash
        self.events[SNAPSHOT_IN_REHASH] += 1
        if r > 0:
            self.events[SNAPSHOT_IN_REHASH_STARTED] += 1
        if 4 * r >= 3 * capacity:
            self.events[SNAPSHOT_IN_REHASH_LATE] += 1

    def _compare_open(self, result: Any) -> None:
        got = {number: entries for number, entries in _list(result, "snapshots")}
        numbers = [number for number, _ in self.open]
        if sorted(got) != sorted(numbers):
            raise Divergence(f"open snapshots {numbers}", f"{sorted(got)}")
        for number, snapshot in self.open:
            self._compare(f"snapshot {number}", got[number], snapshot.contents)

    def _compare(self, what: str, entries: Any, contents: Any) -> None:
        got = self._entries(entries, what)
        expected = self._contents(contents)
        if not _same(got, expected):
            raise Divergence(f"{what} = {expected!r}", repr(got))

    # --- state identity (rule 4)

    def _held(self, result: Any, expected: Any, name: str) -> Any:
        """Compare ``[handle, state]`` (or None) with the model's state; the handle."""
        if result is None:
            if expected is not None:
                raise Divergence(repr(expected), "None")
            return None
        handle, state = _pair(result, name)
        if expected is None or not _same(state, expected):
            raise Divergence(repr(expected), repr(state))
        return handle

    def _store(self, kn: tuple[Any, Any], handle: Any, state: Any) -> None:
        if self.identity and handle is not None and type(state) in _MUTABLE:
            self.stored[kn] = (handle, self.taken)
        else:
            self.stored.pop(kn, None)

    def _handed_out(self, kn: tuple[Any, Any], handle: Any, state: Any, name: str) -> None:
        if not self.identity or handle is None or type(state) not in _MUTABLE:
            return
        tracked = self.stored.get(kn)
        if tracked is None:
            return
        stored, since = tracked
        if handle == stored and any(number > since for number, _ in self.open):
            raise Divergence(
                f"{name} of {kn!r} to hand out a copy (an open snapshot holds the stored "
                "state: rule S)",
                f"the stored object itself (handle {handle!r})",
            )
        if handle != stored and self.taken == since:
            raise Divergence(
                f"{name} of {kn!r} to hand out the stored object (handle {stored!r}: no "
                "snapshot since it was stored)",
                f"another object (handle {handle!r})",
            )

    # --- wire values

    def _entries(self, entries: Any, what: str) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for entry in _list(entries, what):
            if not isinstance(entry, list) or len(entry) != 3:
                raise Divergence(f"{what}: [key, namespace, state] entries", _clip(repr(entry)))
            kn = (_wire_key(entry[0]), _wire_key(entry[1]))
            if kn in out:
                raise Divergence(f"{what}: every mapping once", f"{kn!r} yielded twice")
            out[kn] = entry[2]
        return out

    @staticmethod
    def _contents(contents: Any) -> dict[Any, Any]:
        return {(_wire_key(k), _wire_key(n)): s for (k, n), s in contents.items()}


_ABSENT = object()


def _checks(snapshots: bool, check: bool) -> Iterator[list[Any]]:
    if snapshots:
        yield ["snapshots"]
    if check:
        yield ["check"]


def _keyed(op: tuple[Any, ...]) -> tuple[Any, ...]:
    """The keyed operation of ``interrupt_iteration``."""
    _, _, keyed, key, namespace, state = op
    return (keyed, key, namespace, state) if keyed == "put" else (keyed, key, namespace)


def _request(op: tuple[Any, ...]) -> list[Any]:
    """A workload operation as a protocol operation."""
    name = op[0]
    request = [name, key_to_wire(op[1]), key_to_wire(op[2]), *op[3:]] if len(op) >= 3 else list(op)
    if name == "keys":
        request = [name, key_to_wire(op[1])]
    elif name in ("put_and_get_old", "remove_and_get_old"):
        request.append(MUTATION_ITEM)
    return request


def _wire_key(key: Any) -> Any:
    """A key (either side's) as a hashable wire value: HashKeys as tuples."""
    if type(key) is HashKey:
        return ("HashKey", key.value, key.hash_value)
    if type(key) is dict:
        inner, h = key["HashKey"]
        return ("HashKey", inner, h)
    return key


def _wire_kn(key: Any, namespace: Any) -> tuple[Any, Any]:
    return (_wire_key(key), _wire_key(namespace))


def _same(got: Any, expected: Any) -> bool:
    """The child's JSON value equals the model's (tuples as the wire writes them)."""
    if got == expected:
        return True
    if type(expected) is dict and type(got) is dict:
        return got.keys() == expected.keys() and all(_same(got[k], expected[k]) for k in expected)
    return bool(got == state_to_wire(expected))


def _pair(result: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(result, list) or len(result) != 2:
        raise Divergence(f"{name}: a [.., ..] result", _message(result) or _clip(repr(result)))
    return result[0], result[1]


def _list(result: Any, what: str) -> list[Any]:
    if not isinstance(result, list):
        raise Divergence(f"{what}: a list", _message(result) or _clip(repr(result)))
    return result


def _refused(result: Any) -> bool:
    return type(result) is dict and result.get("error") == "refused"


def _crashed(result: Any) -> bool:
    return type(result) is dict and result.get("error") == "crashed"


def _message(result: Any) -> str:
    if type(result) is dict and "error" in result:
        return f"{result['error']}: {result.get('message', '')}"
    return ""


def _clip(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[: width - 5] + " ..."
