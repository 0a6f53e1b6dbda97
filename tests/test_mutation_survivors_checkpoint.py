"""Tests that kill mutants of the ``checkpoint`` mutation scope the other
killer tests let through (``make mutate SCOPE=checkpoint``).

Each test is named after what it pins; the mutants it was written for are
named in its comment. They are part of the scope's killers
(``scripts/mutation.py``) and of the normal suite.
"""

from __future__ import annotations

import hashlib

import pytest
from pydantic import BaseModel

from cowstate.checkpoint import sealed
from cowstate.checkpoint.paths import shared_path
from cowstate.checkpoint.registry import SharedStateRegistry
from cowstate.errors import (
    CorruptCheckpointError,
    InvalidArgumentError,
    MetadataChecksumError,
    UnsafePathError,
)

#: Until these tests move beside the tests of what they pin.
pytestmark = [
    pytest.mark.kills(module="cowstate.checkpoint.registry"),
    pytest.mark.kills(module="cowstate.checkpoint.paths"),
    pytest.mark.kills(module="cowstate.checkpoint.sealed"),
]

# ------------------------------------------------------------------ registry


def test_users_names_every_retained_checkpoint_that_uses_a_path() -> None:
    # registry.users__mutmut_1..5: no caller in the library runs users().
    registry = SharedStateRegistry()
    registry.register(1, ["job/shared/a", "job/shared/b"])
    registry.register(2, ["job/shared/b"])
    assert registry.users("job/shared/a") == frozenset({1})
    assert registry.users("job/shared/b") == frozenset({1, 2})
    assert registry.users("job/shared/unknown") == frozenset()
    assert isinstance(registry.users("job/shared/unknown"), frozenset)
    assert registry.unregister(1) == ["job/shared/a"]
    assert registry.users("job/shared/a") == frozenset()
    assert registry.users("job/shared/b") == frozenset({2})


def test_unregister_forgets_the_checkpoint() -> None:
    # registry.unregister__mutmut_1 (discard(None)): the registry kept listing a
    # subsumed checkpoint, and refused to register its id again.
    registry = SharedStateRegistry()
    registry.register(1, ["job/shared/a"])
    registry.register(2, ["job/shared/a"])
    assert registry.unregister(1) == []
    assert registry.checkpoints == frozenset({2})
    registry.register(1, ["job/shared/b"])
    assert registry.checkpoints == frozenset({1, 2})


def test_unregister_returns_owned_unused_paths_and_never_disowned_ones() -> None:
    # registry.unregister__mutmut_7 (`path in self._not_owned`): deleted the files
    # of a NO_CLAIM snapshot and leaked the job's own; the reduced storage
    # machine did not subsume a checkpoint holding both within its examples.
    registry = SharedStateRegistry()
    registry.register(1, ["job/shared/own", "old/shared/theirs"])
    registry.disown(["old/shared/theirs"])
    assert not registry.is_owned("old/shared/theirs")
    assert registry.is_owned("job/shared/own")
    assert registry.unregister(1) == ["job/shared/own"]
    assert registry.paths == frozenset()


def test_registering_a_checkpoint_twice_is_refused_and_changes_nothing() -> None:
    # registry.register__mutmut_2 (message None), __mutmut_3 (`add(None)`: the
    # registry never knew which checkpoints it had, so it took the id twice).
    registry = SharedStateRegistry()
    registry.register(3, ["job/shared/a"])
    assert registry.checkpoints == frozenset({3})
    with pytest.raises(InvalidArgumentError) as caught:
        registry.register(3, ["job/shared/b"])
    assert str(caught.value) == "expected checkpoint 3 to be registered once, it already is"
    assert registry.paths == frozenset({"job/shared/a"})
    assert registry.users("job/shared/a") == frozenset({3})


def test_registry_repr_counts_files_and_lists_checkpoints() -> None:
    # registry.__repr____mutmut_1
    registry = SharedStateRegistry()
    registry.register(2, ["j/shared/x", "j/shared/y"])
    registry.register(1, ["j/shared/y"])
    assert repr(registry) == "<SharedStateRegistry 2 files, checkpoints [1, 2]>"


# --------------------------------------------------------------------- paths


def test_shared_path_is_job_shared_name() -> None:
    # paths.x_shared_path__mutmut_1: no killer test built a shared path by name.
    assert shared_path("job-1", "a.sst") == "job-1/shared/a.sst"


@pytest.mark.parametrize(("job_id", "name"), [("..", "a.sst"), ("job", "../a"), ("job", "")])
def test_shared_path_refuses_an_unsafe_job_or_name(job_id: str, name: str) -> None:
    with pytest.raises(UnsafePathError, match="expected"):
        shared_path(job_id, name)


# -------------------------------------------------------------------- sealed


def test_unseal_accepts_a_document_of_exactly_the_maximum_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # sealed.unseal__mutmut_1 (`len(data) >= MAX_DOCUMENT_SIZE`): refused a
    # document at the limit. The limit is lowered so the document stays small.
    document = sealed.seal("metadata", 1, b'{"a": 1}')
    monkeypatch.setattr(sealed, "MAX_DOCUMENT_SIZE", len(document))
    assert sealed.unseal(document, "metadata", 1, "_metadata") == b'{"a": 1}\n'


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


def test_a_sealed_empty_body_unseals() -> None:
    # sealed.unseal__mutmut_13 (`rfind(b"\n", 1, ...)`): with an empty body the
    # seal line follows a newline at offset 0, which a search from 1 misses.
    document = sealed.seal("metadata", 1, b"")
    assert document.startswith(b"\n#cowstate metadata v1 sha256=")
    assert sealed.unseal(document, "metadata", 1, "_metadata") == b"\n"


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


def test_a_document_without_a_seal_line_shows_80_bytes_of_its_last_line() -> None:
    # sealed.unseal__mutmut_24 (`[:81]`); __mutmut_26/27 changed the message's end.
    document = b"y" * 200
    with pytest.raises(MetadataChecksumError) as caught:
        sealed.unseal(document, "restore", 2, "_restore")
    assert str(caught.value) == (
        "expected _restore to end with its seal line '#cowstate restore v2 sha256=...', "
        f"got {b'y' * 80!r} (200 bytes): the file is torn, truncated or not a cowstate document"
    )


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


class _Six(BaseModel):
    a: int
    b: int
    c: int
    d: int
    e: int
    f: int


def test_unseal_model_names_the_file_of_a_torn_document() -> None:
    # sealed.unseal_model__mutmut_5: passed None as the file's name.
    with pytest.raises(MetadataChecksumError, match=r"^expected _savepoint to end with"):
        sealed.unseal_model(b"torn", "savepoint", 1, _Six, "a savepoint", "_savepoint")


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


def test_unseal_model_calls_a_problem_of_the_whole_body_document() -> None:
    document = sealed.seal("metadata", 1, b"[1]")
    with pytest.raises(CorruptCheckpointError) as caught:
        sealed.unseal_model(document, "metadata", 1, _Six, "checkpoint metadata", "_metadata")
    assert str(caught.value).startswith(
        "expected checkpoint metadata in _metadata, got: document: "
    )


class _Nested(BaseModel):
    xs: list[int]


def test_unseal_model_joins_a_nested_location_with_dots() -> None:
    # sealed.unseal_model__mutmut_16: joined the location with 'XX.XX'.
    document = sealed.seal("metadata", 1, b'{"xs": [1, "q"]}')
    with pytest.raises(CorruptCheckpointError) as caught:
        sealed.unseal_model(document, "metadata", 1, _Nested, "checkpoint metadata", "_metadata")
    assert str(caught.value).startswith("expected checkpoint metadata in _metadata, got: xs.1: ")
