"""VOID_NAMESPACE: the namespace of state that has none (Flink's ``VoidNamespace``).

One singleton, hash 99, equal to itself only, pickled by reference and copied
as itself. Its type is ``cowstate._void``'s when that extension is built -- a
type without ``Py_TPFLAGS_HAVE_GC``, so a map whose entries hold only it and
ints or strs costs a full collection nothing (issue 28, ``_void.c``) -- and
:class:`PythonVoidNamespace` otherwise, the same contract as a class written in
Python (a type the garbage collector tracks).

Its public home is :mod:`cowstate.keyed_state` (and :mod:`cowstate`): pickle
stores ``cowstate.keyed_state.VOID_NAMESPACE``, both types say that module,
and it re-exports these names. They are defined here, in the lowest layer
(``tests/test_layering.py``), so the value codec, which encodes the
singleton, reads it without importing the keyed state it serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["VOID_NAMESPACE", "PythonVoidNamespace", "VoidNamespace"]


class PythonVoidNamespace:
    """The namespace of state that has none (Flink's ``VoidNamespace``): a
    singleton, hash 99, equal to itself only, pickled by reference.

    The fallback of :class:`VoidNamespace` when ``cowstate._void`` is not built:
    the same contract, but as a class written in Python it is a type the
    garbage collector tracks, so every map entry holding it counts for a full
    collection (``_void.c`` says why that matters)."""

    # The module pickle stores and messages name, as the C type's: the public home.
    __module__ = "cowstate.keyed_state"

    _instance: PythonVoidNamespace | None = None

    def __new__(cls) -> PythonVoidNamespace:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __hash__(self) -> int:
        return 99  # VoidNamespace.hashCode() in Flink

    def __eq__(self, other: object) -> bool:
        return other is self

    def __repr__(self) -> str:
        return "VOID_NAMESPACE"

    def __reduce__(self) -> str:
        return "VOID_NAMESPACE"  # pickles by reference: one instance


#: The type of :data:`VOID_NAMESPACE`: cowstate._void's, which has no
#: ``Py_TPFLAGS_HAVE_GC`` (issue 28: a backend of int or str states then costs
#: a full collection nothing), or :class:`PythonVoidNamespace` when not built.
if TYPE_CHECKING:
    from cowstate._void import VoidNamespace
else:
    try:
        from cowstate._void import VoidNamespace
    except ImportError:  # no compiler at install time
        VoidNamespace = PythonVoidNamespace

VOID_NAMESPACE = VoidNamespace()
