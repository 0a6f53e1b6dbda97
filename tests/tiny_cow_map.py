"""A tiny copy-on-write map written from docs/protocol.md alone, behind the protocol.

It stands for an implementation in another language: it imports nothing of
cowstate (only the standard library), hashes keys its own way, and speaks
the protocol from the page. Flink's design in miniature: chained buckets
(a fixed power-of-two count, no rehash), entries and states carrying the
map version that made them, a snapshot holding a shallow copy of the
buckets, entries copied before a change while a snapshot may share them
(with every shared entry in front of them in the chain), a state copied
before it is handed out while a snapshot may hold it, and iterators that
fail fast when a mapping comes or goes.

``--bug NAME`` plants one bug (tests/test_process_protocol.py requires the
runner to catch each through the protocol):

- ``get-skips-state-copy``: ``get`` hands out the state a snapshot holds;
- ``remove-relinks-shared-predecessor``: ``remove`` relinks the entry in
  front of the removed one in place, though a snapshot shares it;
- ``copy-without-snapshot``: ``get`` copies the state every time, snapshot
  or not (the values stay right: only the handles show it).
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

BUCKETS = 8


class Refused(Exception):
    """Bad input, refused (a transform function that failed or returned null)."""


class ConcurrentModification(Exception):
    """An iterator saw a mapping come or go."""


class HashKey:
    def __init__(self, value: Any, hash_value: int) -> None:
        self.value, self.hash_value = value, hash_value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashKey) and self.value == other.value

    def __hash__(self) -> int:
        return self.hash_value

    def wire(self) -> Any:
        return {"HashKey": [self.value, self.hash_value]}


def key_of(value: Any) -> Any:
    return HashKey(*value["HashKey"]) if isinstance(value, dict) else value


def wire_of(key: Any) -> Any:
    return key.wire() if isinstance(key, HashKey) else key


def own_hash(key: Any) -> int:
    if isinstance(key, HashKey):
        return key.hash_value
    if isinstance(key, int):
        return key
    h = 0
    for ch in str(key):
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h


def wire_state(state: Any) -> Any:
    if isinstance(state, tuple):
        return {"tuple": [wire_state(item) for item in state]}
    return copy.deepcopy(state)


class Entry:
    def __init__(self, key: Any, ns: Any, state: Any, h: int, nxt: Entry | None, version: int):
        self.key, self.ns, self.state, self.hash, self.next = key, ns, state, h, nxt
        self.entry_version = self.state_version = version

    def copy(self, version: int) -> Entry:
        e = Entry(self.key, self.ns, self.state, self.hash, self.next, version)
        e.state_version = self.state_version
        return e


class TinyMap:
    def __init__(self, bug: str | None) -> None:
        self.bug = bug
        self.table: list[Entry | None] = [None] * BUCKETS
        self.size = 0
        self.version = 0
        self.open: dict[Any, int] = {}  # snapshot id -> version
        self.snapshots: dict[Any, list[Entry | None]] = {}
        self.mod_count = 0

    @property
    def required(self) -> int:
        return max(self.open.values(), default=0)

    def find(self, key: Any, ns: Any) -> tuple[int, Entry | None, Entry | None]:
        h = (own_hash(key) * 31 + own_hash(ns)) & 0xFFFFFFFF
        prev, e = None, self.table[h & (BUCKETS - 1)]
        while e is not None and not (e.hash == h and e.key == key and e.ns == ns):
            prev, e = e, e.next
        return h, prev, e

    def private(self, index: int, until: Entry) -> Entry:
        """Copy every shared entry of chain ``index`` up to ``until``; its copy."""
        current = self.table[index]
        assert current is not None
        mirror = current
        if current.entry_version < self.required:
            mirror = self.table[index] = current.copy(self.version)
        while current is not until:
            assert current.next is not None
            current = current.next
            if current.entry_version < self.required:
                mirror.next = current.copy(self.version)
                mirror = mirror.next
            else:
                mirror = current
        return mirror

    def entry_for_change(self, key: Any, ns: Any) -> tuple[Entry, bool]:
        h, _, e = self.find(key, ns)
        if e is not None:
            if e.entry_version < self.required:
                e = self.private(h & (BUCKETS - 1), e)
            return e, False
        index = h & (BUCKETS - 1)
        e = Entry(key, ns, None, h, self.table[index], self.version)
        self.table[index] = e
        self.size += 1
        self.mod_count += 1
        return e, True

    def handed_out(self, e: Entry) -> Any:
        if self.bug == "copy-without-snapshot" or (
            e.state_version < self.required and self.bug != "get-skips-state-copy"
        ):
            if e.entry_version < self.required:
                e = self.private(e.hash & (BUCKETS - 1), e)
            e.state = copy.deepcopy(e.state)
            e.state_version = self.version
        return e.state

    def get(self, key: Any, ns: Any) -> Any:
        _, _, e = self.find(key, ns)
        return None if e is None else self.handed_out(e)

    def put(self, key: Any, ns: Any, state: Any) -> bool:
        e, new = self.entry_for_change(key, ns)
        e.state, e.state_version = state, self.version
        return new

    def old_state(self, e: Entry) -> Any:
        return copy.deepcopy(e.state) if e.state_version < self.required else e.state

    def remove(self, key: Any, ns: Any) -> Entry | None:
        h, prev, e = self.find(key, ns)
        if e is None:
            return None
        index = h & (BUCKETS - 1)
        if prev is None:
            self.table[index] = e.next
        else:
            if (
                prev.entry_version < self.required
                and self.bug != "remove-relinks-shared-predecessor"
            ):
                prev = self.private(index, prev)
            prev.next = e.next
        self.size -= 1
        self.mod_count += 1
        return e

    def entries(self, table: list[Entry | None]) -> list[Any]:
        out = []
        for head in table:
            e = head
            while e is not None:
                out.append([wire_of(e.key), wire_of(e.ns), wire_state(e.state)])
                e = e.next
        return out

    def iterate(self) -> Any:
        expected = self.mod_count
        for head in list(self.table):
            e = head
            while e is not None:
                if self.mod_count != expected:
                    raise ConcurrentModification()
                yield [wire_of(e.key), wire_of(e.ns), wire_state(e.state)]
                e = e.next
        if self.mod_count != expected:
            raise ConcurrentModification()


def mutate(state: Any, item: int) -> None:
    if isinstance(state, list):
        state.append(item)
    elif isinstance(state, dict):
        state[f"m{item}"] = item


def add_or_append(old: Any, value: int) -> Any:
    if old is None:
        return [value]
    if isinstance(old, bool) or not isinstance(old, int | list | dict):
        return (old, value)
    if isinstance(old, int):
        return old + value
    mutate(old, value)
    return old


def fail(old: Any, value: int) -> Any:
    raise Refused(f"transform refuses {value}")


FUNCTIONS: dict[str, Callable[[Any, int], Any]] = {
    "add_or_append": add_or_append,
    "replace_with_value": lambda old, value: value,
    "raise_error": fail,
    "return_none": lambda old, value: None,
}


class Server:
    def __init__(self, bug: str | None) -> None:
        self.bug = bug
        self.map = TinyMap(bug)

    def held(self, state: Any) -> Any:
        return None if state is None else [id(state), wire_state(state)]

    def op(self, name: str, *args: Any) -> Any:
        m = self.map
        if name == "create":
            self.map = TinyMap(self.bug)
            return None
        if name == "put":
            return [m.put(key_of(args[0]), key_of(args[1]), args[2]), id(args[2])]
        if name in ("get", "get_and_mutate"):
            state = m.get(key_of(args[0]), key_of(args[1]))
            if name == "get_and_mutate" and state is not None:
                mutate(state, args[2])
            return self.held(state)
        if name == "contains_key":
            return m.find(key_of(args[0]), key_of(args[1]))[2] is not None
        if name == "put_and_get_old":
            e, new = m.entry_for_change(key_of(args[0]), key_of(args[1]))
            old = None if new else m.old_state(e)
            e.state, e.state_version = args[2], m.version
            if old is not None:
                mutate(old, args[3])
            return [self.held(old), id(args[2])]
        if name == "remove":
            m.remove(key_of(args[0]), key_of(args[1]))
            return None
        if name == "remove_and_get_old":
            _, _, found = m.find(key_of(args[0]), key_of(args[1]))
            if found is None:
                return None
            old = m.old_state(found)
            m.remove(found.key, found.ns)
            mutate(old, args[2])
            return self.held(old)
        if name == "transform":
            key, ns = key_of(args[0]), key_of(args[1])
            _, _, found = m.find(key, ns)
            old = None if found is None else m.old_state(found)
            new = FUNCTIONS[args[3]](old, args[2])
            if new is None:
                raise Refused("None is not a state")
            e, _ = m.entry_for_change(key, ns)
            e.state, e.state_version = new, m.version
            return [None if old is None else id(old), id(new)]
        if name == "snapshot":
            m.version += 1
            m.open[args[0]] = m.version
            m.snapshots[args[0]] = list(m.table)
            return None
        if name == "release":
            del m.open[args[0]]
            return m.entries(m.snapshots.pop(args[0]))
        if name == "snapshots":
            return [[number, m.entries(table)] for number, table in m.snapshots.items()]
        if name == "iterate":
            return m.entries(m.table)
        if name == "keys":
            ns = key_of(args[0])
            return [entry[0] for entry in m.entries(m.table) if key_of(entry[1]) == ns]
        if name == "interrupt_iteration":
            iterator = m.iterate()
            seen = [next(iterator) for _ in range(args[0] % (m.size + 1))]
            result = self.apply(args[1])
            try:
                step: Any = next(iterator)
            except StopIteration:
                return [seen, result, None, "end", []]
            except ConcurrentModification:
                return [seen, result, None, "failed", []]
            rest: list[Any] = []
            try:
                rest.extend(iterator)
            except ConcurrentModification:
                rest.append("failed")
            return [seen, result, None, step, rest]
        raise ValueError(f"unknown operation {name!r}")

    def apply(self, op: list[Any]) -> Any:
        try:
            return self.op(*op)
        except Refused as exc:
            return {"error": "refused", "message": str(exc)}


def main(argv: list[str]) -> int:
    bug = argv[argv.index("--bug") + 1] if "--bug" in argv else None
    server = Server(bug)
    for line in sys.stdin:
        request = json.loads(line)
        if "hello" in request:
            answer: dict[str, Any] = {
                "protocol": 1,
                "implementation": f"tiny copy-on-write map{' with ' + bug if bug else ''}",
                "capabilities": {"state_handles": True},
            }
            print(json.dumps({"id": request["id"], "hello": answer}), flush=True)
            continue
        results, sizes = [], []
        for op in request["ops"]:
            try:
                results.append(server.apply(op))
            except Exception:
                results.append({"error": "crashed", "message": traceback.format_exc()})
                sizes.append(server.map.size)
                break
            sizes.append(server.map.size)
        print(json.dumps({"id": request["id"], "results": results, "sizes": sizes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
