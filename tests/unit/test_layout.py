"""The README's layout names every module and package of sapo_node/ (and nothing that
is not there): a newcomer finds each file where the README says it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout(depth: int) -> list[str]:
    """The layout's rows of sapo_node/ (depth 1) or of its net/ package (depth 2)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    rows = block.split("\nprotocol/", 1)[0].splitlines()
    if depth == 2:
        rows = rows[[r.startswith("  net/") for r in rows].index(True) + 1 :]
        rows = rows[: [not r.startswith("    ") for r in rows + [""]].index(True)]
    indent = "  " * depth
    return [r for r in rows if r.startswith(indent) and not r.startswith(indent + " ")]


def _named(rows: list[str]) -> set[str]:
    named = set()
    for row in rows:
        files = row.strip().split("  ")[0]  # "a.py, b.py" before the description
        named |= {name.strip() for name in files.split(",")}
    return named


def _present(package: Path, *, init: bool) -> set[str]:
    return {
        p.name + ("/" if p.is_dir() else "")
        for p in package.iterdir()
        if (p.suffix == ".py" and (init or p.name != "__init__.py"))
        or (p.is_dir() and (p / "__init__.py").exists())
    }


def test_the_readme_layout_names_every_module_of_the_package() -> None:
    named, present = _named(_layout(1)), _present(ROOT / "sapo_node", init=False)
    assert present - named == set(), "modules the README's layout does not name"
    assert named - present == set(), "names in the README's layout that are not there"


def test_the_readme_layout_names_every_module_of_the_network() -> None:
    named, present = _named(_layout(2)), _present(ROOT / "sapo_node" / "net", init=True)
    assert present - named == set(), "net/ modules the README's layout does not name"
    assert named - present == set(), "names under net/ in the README's layout not there"


def test_the_layout_rows_are_files_then_what_they_hold() -> None:
    for depth in (1, 2):
        for row in _layout(depth):
            pattern = "  " * depth + r"[a-z_/]+(\.py)?(, [a-z_/]+(\.py)?)*  +\S"
            assert re.match(pattern, row), row
