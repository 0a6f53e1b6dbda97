"""Key types: one key type per keyed backend (as Flink's typed keys), one per domain per table.

Python calls ``1 == 1.0 == True`` (and ``0 == 0.0 == -0.0 == False``) with
equal hashes, so a dict -- and a copy-on-write map -- holds one mapping for
all of them. Flink never meets the question: a job's key serializer fixes one
key type, and ``Integer 1``, ``Double 1.0`` and ``Boolean true`` have
different ``hashCode()`` s, hence different key groups
(:mod:`cowstate.key_groups`), and different serialized bytes (the RocksDB key).
Letting both meanings meet made the heap backend (one map per key group: equal
keys collide only when they share a key group) and the RocksDB backend (byte
keys: never) disagree. The rule that makes every layer agree is Flink's:

K1. A keyed backend has one *key type*, the :func:`key_signature` of its first
    key (its first ``set_current_key``, or the keys a restore brings). A key
    of another signature is refused with
    :class:`~cowstate.errors.KeyTypeMismatchError`, and nothing changes -- not
    even the current key. The backend's tables share its :class:`KeyTypes`.
K2. The signature is the exact type, recursively: ``int``, ``bool``,
    ``float``, ``str``, ``bytes``, ``tuple[int, str]`` (by length and element
    signature; ``None`` inside a tuple is ``None``), and for any other type its
    qualified name. ``1``, ``True`` and ``1.0`` are three types; ``(1, "a")``
    and ``(1.0, "a")`` two. An ``int`` is one type whether Flink would hash it
    as ``Integer`` or ``Long``.
K3. Keys whose equality cannot be kept apart Flink's way are refused
    everywhere, also inside tuples, with
    :class:`~cowstate.errors.AmbiguousKeyError`: a float NaN (``nan != nan``,
    so its mapping could never be found again) and ``-0.0`` (Python's equal of
    ``0.0``, but another Flink key group and other bytes; use ``0.0``).
K4. A state table on its own (not a backend's) holds one key type *per
    domain*: keys that can be equal across types -- numbers (``bool``,
    ``int``, ``float``, any :class:`numbers.Number`), and tuples of the same
    shape over them -- share a domain, every other type is its own. So a
    table may hold ``int`` and ``str`` keys (never equal), but after ``1``
    refuses ``True`` and ``1.0`` as K1 does. Equal keys of different types
    thus never meet in a table, heap or RocksDB, and the rule costs the table
    nothing where keys cannot be equal anyway. (One type per table, as per
    backend, was tried first: it refused the mixes of ints, strings and
    colliding test keys the table state machine builds its long chains and
    rehashes from, and gained nothing, since only keys that can be equal
    can meet in one mapping.)
K5. A restore checks every key it decodes against K1-K4 (check E6 of
    :mod:`cowstate.snapshot.checks`): a backend's restore brings keys of one
    signature, the backend's if one is fixed, else they fix it when the
    restore commits. A refusal is a :class:`~cowstate.errors.MixedKeyTypesError`.

The bare :class:`~cowstate.CopyOnWriteStateMap` has no key type: it is a dict
from ``(key, namespace)``, so equal keys are one mapping there, and the key
object first put stays the mapping's key (as in a dict).

:class:`KeyTypes` costs one set lookup of ``type(key)`` per key once its type
(``int``, ``str``, ``bytes`` or ``bool``) is admitted; floats and tuples are
walked.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from cowstate.errors import AmbiguousKeyError, KeyTypeMismatchError

__all__ = ["KeyTypes", "key_domain", "key_signature"]

_NONE: Any = object()  # no key checked yet

#: Types whose signature is their name and whose values are never ambiguous (K3).
_PLAIN: dict[type, str] = {int: "int", str: "str", bytes: "bytes", bool: "bool"}


def key_signature(key: Any) -> str:
    """The key type signature of ``key`` (K2), refusing an ambiguous key (K3).

    post: isinstance(__return__, str)
    """
    return _signature_and_domain(key)[0]


def key_domain(key: Any) -> str:
    """The domain of ``key`` (K4): ``number`` for numbers, a tuple's shape over
    its fields' domains, else its signature.

    post: isinstance(__return__, str)
    """
    return _signature_and_domain(key)[1]


class KeyTypes:
    """The key types one backend (``per_domain=False``: one type, K1) or one table
    (``per_domain=True``: one type per domain, K4) admitted; none before the
    first key."""

    __slots__ = ("_last", "_signatures", "per_domain", "plain")

    def __init__(self, *, per_domain: bool = False) -> None:
        self.per_domain = per_domain
        self._signatures: dict[str, str] = {}  # domain (or "" for one type) -> signature
        #: The plain types admitted (``int``, ``str``, ``bytes``, ``bool``): a key of
        #: one of them passes with no walk and no lookup (the key context's fast
        #: path reads it, :mod:`cowstate.keyed_state`). Replaced, never shared,
        #: by :meth:`adopt`: read it through the :class:`KeyTypes`.
        self.plain: set[type] = set()
        # The last key found admitted (held, so its id cannot be reused): a
        # backend's current key reaches its tables' checks as the same object.
        self._last: Any = _NONE

    @property
    def signature(self) -> str | None:
        """The one signature of a backend's key type (or of a table's only
        domain so far), or ``None`` before the first key."""
        if len(self._signatures) != 1:
            return None
        return next(iter(self._signatures.values()))

    def check(self, key: Any) -> None:
        """Refuse ``key`` if it may not be a key here (K1, K3, K4); fixes nothing."""
        if key is self._last or type(key) in self.plain:
            return
        domain, signature = self._admissible(key)
        if self._signatures.get(domain) == signature:
            self._last = key

    def admit(self, key: Any) -> None:
        """:meth:`check` ``key``, then admit its type (its domain's, per domain)."""
        if key is self._last or type(key) in self.plain:
            return
        domain, signature = self._admissible(key)
        if domain not in self._signatures:
            self._signatures[domain] = signature
            if _PLAIN.get(type(key)) == signature:
                self.plain.add(type(key))
        self._last = key

    def copy(self) -> KeyTypes:
        """A new :class:`KeyTypes` with the same types (a restore stages on one)."""
        other = KeyTypes(per_domain=self.per_domain)
        other.adopt(self)
        return other

    def adopt(self, other: KeyTypes) -> None:
        """Take ``other``'s types (a restore commits what it staged)."""
        self._signatures = dict(other._signatures)
        self.plain = set(other.plain)
        self._last = _NONE

    def __repr__(self) -> str:
        mode = ", per_domain=True" if self.per_domain else ""
        return f"KeyTypes({sorted(self._signatures.values())!r}{mode})"

    def _admissible(self, key: Any) -> tuple[str, str]:
        """``(domain, signature)`` of ``key`` if it may be a key here."""
        signature, domain = _signature_and_domain(key)
        if not self.per_domain:
            domain = ""
        fixed = self._signatures.get(domain)
        if fixed is not None and fixed != signature:
            first = "the first key" if not self.per_domain else "the first key of its kind"
            raise KeyTypeMismatchError(
                f"expected a key of type {fixed} (fixed by {first}), got {signature}: {key!r:.80}"
            )
        return domain, signature


def _signature_and_domain(key: Any) -> tuple[str, str]:
    kind = type(key)
    plain = _PLAIN.get(kind)
    if plain is not None:
        return plain, ("number" if kind is int or kind is bool else plain)
    if kind is float:
        if key != key:
            raise AmbiguousKeyError(
                f"expected a key equal to itself, got float {key!r}: NaN != NaN, so a mapping "
                "under it could never be found again"
            )
        if key == 0.0 and math.copysign(1.0, key) < 0:
            raise AmbiguousKeyError(
                "expected 0.0 rather than -0.0 as a key, got -0.0: Python calls it equal to "
                "0.0, Flink gives it another key group and other bytes; use 0.0"
            )
        return "float", "number"
    if kind is tuple:
        if not key:
            return "tuple[()]", "tuple[()]"
        fields = [_field(field, key) for field in key]
        return (
            "tuple[" + ", ".join(f[0] for f in fields) + "]",
            "tuple[" + ", ".join(f[1] for f in fields) + "]",
        )
    if key is None:
        return "None", "None"
    module = getattr(kind, "__module__", "")
    name = kind.__qualname__
    signature = name if module == "builtins" else f"{module}.{name}"
    return signature, ("number" if isinstance(key, numbers.Number) else signature)


def _field(field: Any, key: tuple[Any, ...]) -> tuple[str, str]:
    try:
        return _signature_and_domain(field)
    except AmbiguousKeyError as exc:
        raise AmbiguousKeyError(f"{exc} (inside the key {key!r:.80})") from None
