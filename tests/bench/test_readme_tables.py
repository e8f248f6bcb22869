"""The README's benchmark tables are what bench/results/*.json say
(bench/readme_tables.py renders them; nobody types them)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import readme_tables  # noqa: E402


def test_every_table_block_in_the_readme_matches_its_json() -> None:
    text = readme_tables.README.read_text()
    names = re.findall(r"<!-- table:([\w-]+) -->", text)
    assert names, "the README has no generated tables"
    assert set(names) <= set(readme_tables.TABLES), f"unknown tables: {set(names) - set(readme_tables.TABLES)}"
    assert readme_tables.render(text) == text, "README tables differ from bench/results: run bench/readme_tables.py"


def test_each_table_names_the_commit_it_measured() -> None:
    text = readme_tables.README.read_text()
    for name in re.findall(r"<!-- table:([\w-]+) -->", text):
        assert re.search(r"Commit [0-9a-f]{7}", readme_tables.TABLES[name]()), name


def test_an_edited_table_is_caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    text = readme_tables.README.read_text()
    match = re.search(r"<!-- table:([\w-]+) -->\n", text)
    assert match is not None
    edited = text.replace("**", "", 2)  # a hand edit inside the first table
    readme = tmp_path / "README.md"
    readme.write_text(edited)
    monkeypatch.setattr(readme_tables, "README", readme)
    assert readme_tables.main(["--check"]) == 1
    assert readme_tables.main([]) == 0
    assert readme.read_text() == text
