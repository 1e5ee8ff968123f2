"""docs/architecture.md is written from the code; these checks keep it so: every path it names exists, every
`Class.method` its diagrams call is defined, and its "Who may import whom" table is `ALLOWED` of
tests/test_layering.py."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_layering import ALLOWED, LEAVES

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "architecture.md").read_text()


def diagrams(page: str) -> list[str]:
    """The page's fenced blocks without a language: its diagrams."""
    blocks: list[str] = []
    block: list[str] = []
    language: str | None = None
    for line in page.splitlines():
        if line.startswith("```"):
            if language is None:
                language, block = line[3:].strip(), []
            else:
                if not language:
                    blocks.append("\n".join(block))
                language = None
        elif language is not None:
            block.append(line)
    return blocks


def test_every_path_the_page_names_exists() -> None:
    paths = set(re.findall(r"\b((?:hone|tests)/[\w/]*(?:\.py)?)", PAGE))
    assert paths, "the page names no paths?"
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


def test_every_method_the_diagrams_call_is_defined() -> None:
    sources = {p: p.read_text() for p in (ROOT / "hone").rglob("*.py")}
    calls = {m for block in diagrams(PAGE) for m in re.findall(r"\b(_?[A-Z]\w*)\.(\w+)\b", block)}
    assert len(calls) > 10
    missing = []
    for cls, method in sorted(calls):
        homes = [text for text in sources.values() if re.search(rf"^class {cls}\b", text, re.M)]
        if not any(re.search(rf"^\s+(?:async )?def {method}\b", text, re.M) for text in homes):
            missing.append(f"{cls}.{method}")
    assert missing == []


def test_the_import_table_is_the_layering_tests() -> None:
    section = PAGE.split("## Who may import whom", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", section, re.M)
    table: dict[str, frozenset[str]] = {}
    for packages, imports in rows[1:]:  # after the header
        allowed = frozenset() if imports == "nothing else" else frozenset(imports.split(", "))
        named = set(re.findall(r"`(\w+)`", packages)) | (LEAVES if packages.startswith("leaves") else set())
        table |= dict.fromkeys(named, allowed)
    expected = {k: v for k, v in ALLOWED.items() if k != "__init__"}
    assert table == expected
