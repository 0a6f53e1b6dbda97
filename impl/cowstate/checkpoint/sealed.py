"""Sealed documents: the small JSON files of a job directory, with a checksum.

``_metadata``, ``_restore`` and ``_savepoint`` are read back after a crash or
from someone else's directory, so each carries its format version and a
SHA-256 of its own content, and is verified before a byte of it is parsed::

    <UTF-8 JSON body>\\n
    #cowstate <kind> v<version> sha256=<64 hex digits of SHA-256(body + "\\n")>\\n

The body stays readable (``cat _metadata`` shows the JSON); the last line is
the seal. A torn write (empty, truncated), a bit flip or a hand edit fails
the seal: :class:`~cowstate.errors.MetadataChecksumError`. A seal of another
kind or of an unknown version is
:class:`~cowstate.errors.UnsupportedMetadataVersionError`.

A checksum detects accidents, not attackers: whoever can write the file can
recompute it. What keeps a hostile document harmless is the rest of the
reader -- confined paths (:mod:`~cowstate.checkpoint.paths`), consistency
checks (:mod:`~cowstate.checkpoint.verify`), and serializers that never run
code from a file.
"""

from __future__ import annotations

import hashlib
import re
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from cowstate.errors import (
    CorruptCheckpointError,
    MetadataChecksumError,
    UnsupportedMetadataVersionError,
)

__all__ = ["MAX_DOCUMENT_SIZE", "seal", "unseal", "unseal_model"]

ModelT = TypeVar("ModelT", bound=BaseModel)

#: Larger documents are refused before they are hashed or parsed.
MAX_DOCUMENT_SIZE = 64 << 20
_SEAL = re.compile(rb"#cowstate ([a-z_]+) v(\d{1,6}) sha256=([0-9a-f]{64})\n\Z")
#: A last line an error message shows (its first 80 bytes, escaped); any other is
#: "binary data".
_PRINTABLE = re.compile(rb"[\x20-\x7e\t\r\n]*")


def seal(kind: str, version: int, body: bytes) -> bytes:
    """``body`` (JSON) followed by its seal line."""
    content = body.rstrip(b"\n") + b"\n"
    digest = hashlib.sha256(content).hexdigest()
    return content + f"#cowstate {kind} v{version} sha256={digest}\n".encode("ascii")


def unseal(data: bytes, kind: str, version: int, where: str) -> bytes:
    """The body of the sealed document ``data``, verified.

    ``where`` names the file in error messages.
    """
    if len(data) > MAX_DOCUMENT_SIZE:
        # a read limited to MAX_DOCUMENT_SIZE stops one byte past it
        # (FileSystem.read_bytes): then only "more" is known, not the size
        got = "more" if len(data) == MAX_DOCUMENT_SIZE + 1 else f"{len(data)}"
        raise MetadataChecksumError(
            f"expected {where} of at most {MAX_DOCUMENT_SIZE} bytes, got {got}"
        )
    cut = data.rfind(b"\n", 0, len(data) - 1) + 1
    match = _SEAL.match(data, cut)
    if match is None:
        shown = data[cut:][:80]
        got = repr(shown) if _PRINTABLE.fullmatch(data, cut) else "binary data"
        raise MetadataChecksumError(
            f"expected {where} to end with its seal line '#cowstate {kind} v{version} "
            f"sha256=...', got {got} ({len(data)} bytes): the file is torn, truncated or "
            "not a cowstate document"
        )
    found_kind, found_version, digest = match.groups()
    if found_kind.decode() != kind or int(found_version) != version:
        raise UnsupportedMetadataVersionError(
            f"expected {where} to be a {kind} document of version {version}, got "
            f"{found_kind.decode()} version {int(found_version)}"
        )
    body = data[:cut]
    actual = hashlib.sha256(body).hexdigest()
    if actual != digest.decode():
        raise MetadataChecksumError(
            f"expected {where} to match its SHA-256 {digest.decode()[:16]}..., got "
            f"{actual[:16]}...: the file is corrupt or was edited"
        )
    return body


def unseal_model(
    data: bytes, kind: str, version: int, model: type[ModelT], what: str, where: str
) -> ModelT:
    """The ``model`` in the sealed document ``data``: :func:`unseal`, then the
    schema; a body that does not validate is a :class:`CorruptCheckpointError`
    naming ``what`` was expected and its first problems."""
    body = unseal(data, kind, version, where)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'document'}: {e['msg']}"
            for e in exc.errors(include_url=False)[:5]
        )
        raise CorruptCheckpointError(f"expected {what} in {where}, got: {problems}") from None
