"""The library's escapes from ``mypy --strict``: few, narrow and explained.

``impl/`` holds at most :data:`LIMIT` ``# type: ignore`` comments, and each
(T1) names the error code it silences (``# type: ignore[<code>]``), so a new
error on the same line is still reported, and (T2) says why on the same line,
in a comment after it. The comments are read with :mod:`tokenize`, so text in
a string or docstring is not one. The checker is tested on planted sources: an
escape without a code or a reason first, in the middle and last.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPL = ROOT / "impl"
LIMIT = 4

_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<code>\[[a-z-]+(?:,\s*[a-z-]+)*\])?(?P<rest>.*)$")


def escapes(source: str, name: str) -> list[tuple[str, str]]:
    """Every ``type: ignore`` comment of ``source`` as ``(where, what is wrong)``;
    ``what`` is empty when it names its code (T1) and gives its reason (T2)."""
    found: list[tuple[str, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        match = _IGNORE.search(token.string)
        if match is None:
            continue
        where = f"{name}:{token.start[0]}"
        if match["code"] is None:
            found.append((where, "names no error code (T1)"))
        elif not re.match(r"\s*#\s*\w", match["rest"]):
            found.append((where, "gives no reason after it (T2)"))
        else:
            found.append((where, ""))
    return found


def _impl_escapes() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in sorted(IMPL.rglob("*.py")):
        found += escapes(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return found


def test_impl_has_at_most_four_type_ignores() -> None:
    found = _impl_escapes()
    assert len(found) <= LIMIT, (
        f"expected at most {LIMIT} type: ignore in impl/, got {len(found)}: "
        + ", ".join(where for where, _ in found)
    )


def test_every_type_ignore_in_impl_names_its_code_and_its_reason() -> None:
    wrong = [f"{where} {what}" for where, what in _impl_escapes() if what]
    assert not wrong, "; ".join(wrong)


_GOOD = "x = f()  # type: ignore[no-any-return]  # f is untyped\n"
_NO_CODE = "y = g()  # type: ignore  # g is untyped\n"
_NO_REASON = "z = h()  # type: ignore[assignment]\n"


@pytest.mark.parametrize("bad", [_NO_CODE, _NO_REASON], ids=["no-code", "no-reason"])
@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "middle", "last"])
def test_an_escape_without_its_code_or_reason_is_named_wherever_it_stands(
    bad: str, position: int
) -> None:
    lines = [_GOOD, _GOOD]
    lines.insert(position, bad)
    found = escapes("".join(lines), "planted.py")
    assert [where for where, what in found if what] == [f"planted.py:{position + 1}"]
    assert len(found) == 3


def test_type_ignore_in_a_string_is_not_an_escape() -> None:
    assert escapes('TEXT = "# type: ignore"\n"""# type: ignore"""\n', "planted.py") == []
