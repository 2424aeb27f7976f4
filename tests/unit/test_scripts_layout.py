"""The scripts stay readable: none is over 500 lines, each one's ``main`` fits on a
screen, and what two of them share is in scripts/support/, not imported from one
another."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
MAX_LINES = 500
MAX_MAIN_LINES = 60  # a screen


def _python_files() -> list[Path]:
    return sorted(SCRIPTS.rglob("*.py"))


def test_no_script_or_support_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines (move a concern to scripts/support/): {long}"


def test_each_scripts_main_fits_on_a_screen() -> None:
    long = {}
    for p in sorted(SCRIPTS.glob("*.py")):
        for node in ast.parse(p.read_text(encoding="utf-8")).body:
            is_main = isinstance(node, ast.FunctionDef) and node.name == "main"
            if is_main and (n := node.end_lineno - node.lineno + 1) > MAX_MAIN_LINES:
                long[p.name] = n
    assert not long, f"main over {MAX_MAIN_LINES} lines: {long}"


def test_no_script_imports_another() -> None:
    scripts = {p.stem for p in SCRIPTS.glob("*.py")}
    found = []
    for p in _python_files():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{p.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in scripts]
    assert not found, f"import the shared part from scripts.support instead: {found}"
