"""The key context keyed states read, and what every keyed state handle shares.

A keyed state handle (the handles of each kind are in
:mod:`cowstate.descriptors`, beside their descriptors) holds no data: it reads
and writes the table of its name at the backend's *current key* and *current
namespace* (:class:`KeyContext`), through the :class:`StateHolder` of its
state. ``set_current_key`` computes the key's key group once, so state
accesses route without hashing again, and holds the backend to one key type
(:mod:`cowstate.key_types`, K1): a key of another type than the first,
however equal (``True`` after ``1``), is refused, never taken for the current
key because it compares equal.

:class:`KeyedState` is the base of every handle: ``clear`` and the three
table calls at the current key and namespace (``_get``, ``_put``,
``_transform``) the kinds' handles are written with.

The direct route
================
A keyed update is ``set_current_key``, ``value()``, ``update()``: the path
is kept short (issue 28: it checked the key type three times and crossed
five Python frames before the map).

D1. ``set_current_key`` checks the key type once. A key whose exact type is
    the backend's admitted plain type (``KeyTypes.plain``: ``int``, ``str``,
    ``bytes`` or ``bool``; such a key is hashable, not ``None`` and never
    ambiguous) is hashed in C (:func:`key_group_of`,
    :mod:`cowstate._keygroups`) and, its key group in the range, made current
    at once. Every other key -- the first key, another type, a float, a
    tuple, an int beyond int64, a key group outside the range -- takes
    :meth:`KeyContext.set_key`, every check in its order, so errors and
    messages are those of the checked path. The context keeps the key's
    ``index`` in the range (``-1`` with no current key).
D2. A :class:`StateHolder` whose table offers a direct route
    (:meth:`~cowstate.state_table.StateTable.direct_route`) over the
    backend's own ``KeyTypes`` holds ``routes``: for every index of the
    backend's range, the map of that key group, and ``None`` last (the
    index ``-1``) and wherever the table has no map. A holder of any other
    table holds only ``None``. ``routes`` is rebuilt whenever ``table`` is
    set (a restore swaps tables).
D3. A handle reads ``routes[context.index]``: a map, and it calls the map
    directly with the current key and namespace -- the key was checked for
    that table's ``KeyTypes`` by D1 and its key group is the map's, which is
    all the table's routing does -- and tells the table of a write that added
    or removed a mapping (``count_modification``: its iterators fail fast);
    ``None``, and it calls the table as before (no current key raises
    :class:`~cowstate.errors.NoCurrentKeyError` there). ``ValueState``'s
    ``value``/``update``, ``ListState``'s ``get``/``add`` and ``MapState``'s
    ``get``/``put`` reach the map from their own frame; the other operations
    through one more (``_get``, ``_put``, ``_transform``, ``clear``).

Under ``COWSTATE_PURE_PYTHON=1`` or without the C extension
:func:`key_group_of` is Python's ``-1`` for every key: D1 always takes the
checked path; D2 and D3 are the same over the pure map.

At run time this module imports no table, no protocol and no descriptor (they
are named for the type checker only), so :mod:`cowstate.kinds` -- which the
snapshot checks read -- sits below the tables.

:data:`VOID_NAMESPACE`, the namespace of state without one, and its types
are defined in :mod:`cowstate.void_namespace` (the lowest layer, so the value
codec reads it) and re-exported here, their public home: pickle stores
``cowstate.keyed_state.VOID_NAMESPACE``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from cowstate.errors import InvalidArgumentError, NoCurrentKeyError, UnhashableKeyError
from cowstate.key_groups import KeyGroupRange, assign_to_key_group
from cowstate.key_types import KeyTypes
from cowstate.maps import FORCED_PURE
from cowstate.serializers import StateSerializer
from cowstate.void_namespace import VOID_NAMESPACE, PythonVoidNamespace, VoidNamespace


def _c_key_group_or_none() -> Callable[[Any, int, bool], int] | None:
    """``cowstate._keygroups.key_group``, or None where it was not built (no
    compiler at install time)."""
    try:
        from cowstate._keygroups import key_group
    except ImportError:
        return None
    return key_group


_c_key_group = _c_key_group_or_none()

if TYPE_CHECKING:  # for the annotations only: both import this module
    from cowstate.descriptors import StateDescriptor
    from cowstate.protocols import KeyedTable

__all__ = [
    "VOID_NAMESPACE",
    "KeyContext",
    "KeyedState",
    "PythonVoidNamespace",
    "StateHolder",
    "VoidNamespace",
]


_NO_KEY: Any = object()


def _python_key_group(key: Any, max_parallelism: int, long_keys: bool) -> int:
    """-1: without the C hash every key takes the checked path (D1)."""
    return -1


#: ``key_group_of(key, max_parallelism, long_keys)``: the key group of a key
#: hashed in C, -1 for the others (D1).
key_group_of = _python_key_group if _c_key_group is None or FORCED_PURE else _c_key_group


class KeyContext:
    """The current key, its key group, and the current namespace of a backend.

    ``index`` is the current key group's position in the range (-1 with no
    key), what the handles' direct route reads (D2, D3); ``first_key_group``,
    ``key_group_count`` and ``long_keys`` are what ``set_current_key``'s
    fast path needs (D1).
    """

    __slots__ = (
        "first_key_group",
        "index",
        "key_group",
        "key_group_count",
        "key_group_range",
        "key_serializer",
        "key_types",
        "long_keys",
        "max_parallelism",
        "namespace",
        "raw_key",
    )

    def __init__(
        self, key_group_range: KeyGroupRange, max_parallelism: int, key_serializer: StateSerializer
    ) -> None:
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.key_serializer = key_serializer
        #: The backend's key type (K1), shared with its tables.
        self.key_types = KeyTypes()
        self.raw_key: Any = _NO_KEY
        self.key_group = -1
        self.index = -1
        self.namespace: Any = VOID_NAMESPACE
        self.first_key_group = key_group_range.start_key_group
        self.key_group_count = len(key_group_range)
        #: Ints hash as ``java.lang.Long`` (``cowstate.key_groups``).
        self.long_keys = getattr(key_serializer, "identifier", None) == "int64"

    @property
    def key(self) -> Any:
        """The current key (:class:`NoCurrentKeyError` before the first ``set_key``)."""
        if self.raw_key is _NO_KEY:
            raise NoCurrentKeyError(
                "expected a current key, got none: call set_current_key(key) before "
                "using keyed state"
            )
        return self.raw_key

    def set_key(self, key: Any) -> None:
        """Make ``key`` current; it must belong to this backend's key groups and be
        of its key type (K1, K3 of :mod:`cowstate.key_types`). Every key is
        checked, also one equal to the current key: ``True`` after ``1`` is
        another key (or a refusal), never the same one. (The checked path of
        D1: ``set_current_key`` comes here for every key it does not take.)"""
        UnhashableKeyError.check(key)
        if key is None:
            raise InvalidArgumentError("expected a key, got None; a key must not be None")
        key_group = assign_to_key_group(key, self.max_parallelism, self.key_serializer)
        index = self.key_group_range.index_of(key_group)  # KeyGroupOutOfRangeError outside
        self.key_types.admit(key)  # K1 (the first key fixes the type), K3: NaN, -0.0
        self.raw_key = key
        self.key_group = key_group
        self.index = index

    def set_namespace(self, namespace: Any) -> None:
        if namespace is None:
            raise InvalidArgumentError(
                "expected a namespace, got None; use VOID_NAMESPACE for state without one"
            )
        UnhashableKeyError.check(namespace, "namespace")
        self.namespace = namespace


#: The table type a backend keeps (a heap table, a RocksDB table ...).
T_co = TypeVar("T_co", bound="KeyedTable[Any, Any, Any]", covariant=True)


class StateHolder(Generic[T_co]):
    """A registered state: its descriptor and its current table.

    ``descriptor`` is ``None`` for a state restored from a snapshot and not
    yet registered by a descriptor.

    A restore swaps the table; handles read it through the holder, so a
    handle taken before a restore keeps working after it. Setting ``table``
    also sets ``routes``, the direct route of the handles (D2), for the
    backend's ``context`` (none without one).
    """

    __slots__ = ("context", "count_modification", "descriptor", "routes", "table")

    #: D2: the map of each index of the backend's range, or ``None``; ``None`` last.
    routes: Sequence[Any] | _Unrouted
    #: D3: the table's ``count_modification`` (with a direct route).
    count_modification: Callable[[], None]

    def __init__(
        self,
        descriptor: StateDescriptor | None,
        table: T_co,
        context: KeyContext | None = None,
    ) -> None:
        self.descriptor = descriptor
        self.context = context
        self.table = table

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "table":
            routes = _routes(self.context, value)
            object.__setattr__(self, "routes", routes)
            routed = isinstance(routes, list) and any(m is not None for m in routes)
            count = value.count_modification if routed else _no_route
            object.__setattr__(self, "count_modification", count)


class _Unrouted:
    """The routes of a holder without a backend's context: ``None`` at every index."""

    __slots__ = ()

    def __getitem__(self, index: int) -> None:
        return None


_UNROUTED = _Unrouted()


def _routes(context: KeyContext | None, table: Any) -> Sequence[Any] | _Unrouted:
    """D2: ``table``'s map for each index of ``context``'s range (``None`` where
    it has none, or has no direct route over the context's key types), then
    ``None`` for the index -1."""
    if context is None:
        return _UNROUTED
    routes: list[Any] = [None] * (context.key_group_count + 1)
    route_of = getattr(table, "direct_route", None)
    if route_of is None:
        return routes
    if getattr(table, "key_types", None) is not context.key_types:
        return routes  # D1 checked the current key for the backend's types only
    route = route_of()
    if route is None:
        return routes
    maps, first = route
    for index in range(context.key_group_count):
        position = context.first_key_group + index - first
        if 0 <= position < len(maps):
            routes[index] = maps[position]
    return routes


def _no_route() -> None:
    """A holder without a direct route never counts (its table does)."""
    raise AssertionError("expected a direct route to count a modification, got none")


class KeyedState:
    """What every keyed state does: ``clear`` at the current key and namespace,
    and the table calls the kinds' handles are written with, each taking the
    direct route (D3) when the holder has one."""

    __slots__ = ("_context", "_holder")

    def __init__(self, context: KeyContext, holder: StateHolder[KeyedTable[Any, Any, Any]]) -> None:
        self._context = context
        self._holder = holder

    @property
    def name(self) -> str:
        return self._holder.table.meta.name

    def clear(self) -> None:
        """Remove the state of the current key and namespace."""
        c = self._context
        m = self._holder.routes[c.index]
        if m is None:
            self._holder.table.remove(c.key, c.namespace, key_group=c.key_group)
            return
        size = len(m)  # D3
        m.remove(c.raw_key, c.namespace)
        if len(m) != size:
            self._holder.count_modification()

    def _get(self) -> Any:
        c = self._context
        m = self._holder.routes[c.index]
        if m is None:
            return self._holder.table.get(c.key, c.namespace, key_group=c.key_group)
        return m.get(c.raw_key, c.namespace)  # D3

    def _put(self, state: Any) -> None:
        c = self._context
        m = self._holder.routes[c.index]
        if m is None:
            self._holder.table.put(c.key, c.namespace, state, key_group=c.key_group)
        elif m.put(c.raw_key, c.namespace, state):  # D3
            self._holder.count_modification()

    def _transform(self, value: Any, fn: Callable[[Any, Any], Any]) -> None:
        c = self._context
        m = self._holder.routes[c.index]
        if m is None:
            self._holder.table.transform(c.key, c.namespace, value, fn, key_group=c.key_group)
            return
        size = len(m)  # D3
        m.transform(c.raw_key, c.namespace, value, fn)
        if len(m) != size:
            self._holder.count_modification()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
