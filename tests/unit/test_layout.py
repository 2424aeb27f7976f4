"""The README's layout names every module and package of sapo_node/ (and nothing that
is not there): a newcomer finds each file where the README says it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    rows = block.split("\nprotocol/", 1)[0].splitlines()
    return [row for row in rows if row.startswith("  ")]


def test_the_readme_layout_names_every_module_of_the_package() -> None:
    named = set()
    for row in _layout():
        files = row.strip().split("  ")[0]  # "a.py, b.py" before the description
        named |= {name.strip() for name in files.split(",")}
    package = ROOT / "sapo_node"
    present = {
        p.name + ("/" if p.is_dir() else "")
        for p in package.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert present - named == set(), "modules the README's layout does not name"
    assert named - present == set(), "names in the README's layout that are not there"


def test_the_layout_rows_are_files_then_what_they_hold() -> None:
    for row in _layout():
        assert re.match(r"^  [a-z_/]+(\.py)?(, [a-z_/]+(\.py)?)*  +\S", row), row
