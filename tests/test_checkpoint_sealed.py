"""Sealed documents (``cowstate.checkpoint.sealed``): ``_metadata``,
``_restore`` and ``_savepoint`` carry a seal line with their kind, version and
SHA-256, and are verified before a byte of them is parsed.

- sealing: the body keeps everything but its trailing newlines;
- size: a document of at most ``MAX_DOCUMENT_SIZE`` bytes is read; a larger
  one is refused naming both sizes ("more" when only the limit was read);
- the seal line: found after the last newline of the body (an empty body
  too); a line after it, or no seal line, is refused showing 80 bytes of the
  last line;
- the checksum: a mismatch names 16 hex digits of both digests;
- ``unseal_model``: a document of another schema is a
  ``CorruptCheckpointError`` naming the file and the first five problems by
  field (nested locations joined with dots, the whole body as "document").

The messages are compared word for word. The tests marked ``kills`` were
written to kill mutants of the module (``make mutate SCOPE=checkpoint``);
their comments name the mutants.
"""

from __future__ import annotations

import hashlib

import pytest
from pydantic import BaseModel

from cowstate.checkpoint import sealed
from cowstate.errors import CorruptCheckpointError, MetadataChecksumError

# -------------------------------------------------------------- sealing a body


# sealed.seal__mutmut_3 (`rstrip(None)`), __mutmut_4 (`lstrip`), __mutmut_5
# (`rstrip(b"XX\nXX")`): the seal drops only the body's trailing newlines;
# leading newlines, trailing blanks and a trailing X are content.
@pytest.mark.kills(module="cowstate.checkpoint.sealed")
@pytest.mark.parametrize(
    ("body", "content"),
    [(b"\n{} \t", b"\n{} \t\n"), (b"{}X\n\n", b"{}X\n"), (b"{}", b"{}\n")],
    ids=["leading-newline-trailing-blanks", "trailing-x-then-newlines", "bare"],
)
def test_a_sealed_body_keeps_everything_but_its_trailing_newlines(
    body: bytes, content: bytes
) -> None:
    data = sealed.seal("metadata", 2, body)
    assert data.startswith(content)
    assert data[len(content) :].startswith(b"#cowstate metadata v2 sha256=")
    assert sealed.unseal(data, "metadata", 2, "the test document") == content


# ------------------------------------------------------------------------ size


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_unseal_accepts_a_document_of_exactly_the_maximum_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # sealed.unseal__mutmut_1 (`len(data) >= MAX_DOCUMENT_SIZE`): refused a
    # document at the limit. The limit is lowered so the document stays small.
    document = sealed.seal("metadata", 1, b'{"a": 1}')
    monkeypatch.setattr(sealed, "MAX_DOCUMENT_SIZE", len(document))
    assert sealed.unseal(document, "metadata", 1, "_metadata") == b'{"a": 1}\n'


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
@pytest.mark.parametrize(("over", "got"), [(2, "{size}"), (1, "more")])
def test_unseal_refuses_a_document_over_the_maximum_size_saying_both_sizes(
    monkeypatch: pytest.MonkeyPatch, over: int, got: str
) -> None:
    # sealed.unseal__mutmut_2: the message of the size check was None. One
    # byte over is what a read limited to the maximum returns of any larger
    # file (FileSystem.read_bytes), so its size is not known: "more".
    document = sealed.seal("metadata", 1, b'{"a": 1}')
    monkeypatch.setattr(sealed, "MAX_DOCUMENT_SIZE", len(document) - over)
    with pytest.raises(MetadataChecksumError) as caught:
        sealed.unseal(document, "metadata", 1, "_metadata")
    assert str(caught.value) == (
        f"expected _metadata of at most {len(document) - over} bytes, "
        f"got {got.format(size=len(document))}"
    )


# --------------------------------------------------------------- the seal line


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_a_sealed_empty_body_unseals() -> None:
    # sealed.unseal__mutmut_13 (`rfind(b"\n", 1, ...)`): with an empty body the
    # seal line follows a newline at offset 0, which a search from 1 misses.
    document = sealed.seal("metadata", 1, b"")
    assert document.startswith(b"\n#cowstate metadata v1 sha256=")
    assert sealed.unseal(document, "metadata", 1, "_metadata") == b"\n"


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_a_line_after_the_seal_is_refused_showing_that_line() -> None:
    # sealed.unseal__mutmut_15 (`rfind(..., len(data) - 2)`): took the seal line
    # for the last line and showed it; unseal__mutmut_23: showed None.
    document = sealed.seal("metadata", 1, b'{"a": 1}') + b"\n"
    with pytest.raises(MetadataChecksumError) as caught:
        sealed.unseal(document, "metadata", 1, "_metadata")
    assert str(caught.value) == (
        "expected _metadata to end with its seal line '#cowstate metadata v1 sha256=...', "
        f"got b'\\n' ({len(document)} bytes): the file is torn, truncated or not a cowstate "
        "document"
    )


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_a_document_without_a_seal_line_shows_80_bytes_of_its_last_line() -> None:
    # sealed.unseal__mutmut_24 (`[:81]`); __mutmut_26/27 changed the message's end.
    document = b"y" * 200
    with pytest.raises(MetadataChecksumError) as caught:
        sealed.unseal(document, "restore", 2, "_restore")
    assert str(caught.value) == (
        "expected _restore to end with its seal line '#cowstate restore v2 sha256=...', "
        f"got {b'y' * 80!r} (200 bytes): the file is torn, truncated or not a cowstate document"
    )


# ---------------------------------------------------------------- the checksum


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_a_checksum_mismatch_names_16_hex_digits_of_both_digests() -> None:
    # sealed.unseal__mutmut_40/41: 17 digits of the expected / actual digest.
    document = sealed.seal("metadata", 1, b'{"a": 1}')
    edited = document.replace(b'{"a": 1}', b'{"a": 2}')
    expected = document.rsplit(b"sha256=", 1)[1][:16].decode()
    actual = hashlib.sha256(b'{"a": 2}\n').hexdigest()[:16]
    with pytest.raises(MetadataChecksumError) as caught:
        sealed.unseal(edited, "metadata", 1, "_metadata")
    assert str(caught.value) == (
        f"expected _metadata to match its SHA-256 {expected}..., got {actual}...: "
        "the file is corrupt or was edited"
    )


# ---------------------------------------------------- unseal_model: the schema


class _Six(BaseModel):
    a: int
    b: int
    c: int
    d: int
    e: int
    f: int


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_unseal_model_names_the_file_of_a_torn_document() -> None:
    # sealed.unseal_model__mutmut_5: passed None as the file's name.
    with pytest.raises(MetadataChecksumError, match=r"^expected _savepoint to end with"):
        sealed.unseal_model(b"torn", "savepoint", 1, _Six, "a savepoint", "_savepoint")


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_unseal_model_lists_the_first_five_problems_by_field() -> None:
    # sealed.unseal_model__mutmut_11/12: the problems became None.
    body = b'{"a": "x", "b": "x", "c": "x", "d": "x", "e": "x", "f": "x"}'
    document = sealed.seal("metadata", 1, body)
    with pytest.raises(CorruptCheckpointError) as caught:
        sealed.unseal_model(document, "metadata", 1, _Six, "checkpoint metadata", "_metadata")
    message = str(caught.value)
    assert message.startswith("expected checkpoint metadata in _metadata, got: a: Input should")
    problems = message.split("got: ", 1)[1].split("; ")
    assert [p.split(":")[0] for p in problems] == ["a", "b", "c", "d", "e"]
    assert all("valid integer" in p for p in problems)


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_unseal_model_calls_a_problem_of_the_whole_body_document() -> None:
    document = sealed.seal("metadata", 1, b"[1]")
    with pytest.raises(CorruptCheckpointError) as caught:
        sealed.unseal_model(document, "metadata", 1, _Six, "checkpoint metadata", "_metadata")
    assert str(caught.value).startswith(
        "expected checkpoint metadata in _metadata, got: document: "
    )


class _Nested(BaseModel):
    xs: list[int]


@pytest.mark.kills(module="cowstate.checkpoint.sealed")
def test_unseal_model_joins_a_nested_location_with_dots() -> None:
    # sealed.unseal_model__mutmut_16: joined the location with 'XX.XX'.
    document = sealed.seal("metadata", 1, b'{"xs": [1, "q"]}')
    with pytest.raises(CorruptCheckpointError) as caught:
        sealed.unseal_model(document, "metadata", 1, _Nested, "checkpoint metadata", "_metadata")
    assert str(caught.value).startswith("expected checkpoint metadata in _metadata, got: xs.1: ")
