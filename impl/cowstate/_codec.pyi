"""Type stub of impl/cowstate/_codecmodule.c (the C codec, impl/cowstate/_codec.c)."""

from collections.abc import Callable
from typing import Any, Final, final

#: What decode() returns for bytes the Python deserializer must decide about.
FALLBACK: Final[object]
KIND_PYTHON: Final[int]
KIND_VALUE: Final[int]
KIND_INT32: Final[int]
KIND_INT64: Final[int]
KIND_UTF8: Final[int]
KIND_BYTES: Final[int]
#: The planted bug this build carries (-DCOWSTATE_CODEC_BUG=n), 0 for none.
BUG: Final[int]
#: The planted snapshot-writer bug of this build (-DCOWSTATE_WRITER_BUG=n), 0 for none.
WRITER_BUG: Final[int]
#: 1 when crc32 is zlib's own, 0 when it is the table-driven one.
CRC32_IS_ZLIB: Final[int]

def encode(kind: int, value: object, /) -> bytes | None: ...
def decode(kind: int, data: bytes | bytearray | memoryview, /) -> object: ...
def crc32(data: bytes | bytearray | memoryview, start: int = 0, /) -> int: ...
def encode_section(
    items: object,
    key_kind: int,
    key_serialize: Callable[[Any], Any],
    namespace_kind: int,
    namespace_serialize: Callable[[Any], Any],
    state_kind: int,
    state_serialize: Callable[[Any], Any],
    /,
) -> bytes | list[tuple[Any, Any, Any]] | None: ...
def decode_section(
    payload: bytes,
    position: int,
    entries: int,
    key_kind: int,
    state_kind: int,
    decoder: Any,
    key_group: int,
    block: Any,
    /,
) -> tuple[int, int]: ...
def encode_without_gil(kind: int, values: list[Any], rounds: int, /) -> list[bytes | str]: ...
def write_blocks(
    stream: Any,
    position: int,
    first: int,
    last: int,
    states: list[tuple[list[Any], int, int, int, Any, Any, Any, list[int] | None] | None],
    cancelled: Callable[[int], object] | None,
    written: Callable[[int], object] | None,
    python_section: Callable[[int, int], tuple[int, bytes]],
    buffer_size: int,
    /,
) -> tuple[list[int], int, int]: ...

@final
class FrozenChanges:
    """Key, namespace and state per entry, flat (freeze_changes, flat_removals)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...

def flat_removals(pairs: list[tuple[Any, Any]], /) -> FrozenChanges: ...
def freeze_changes(snapshot: Any, since: int, /) -> FrozenChanges | None: ...
def snapshot_type() -> type | None: ...
