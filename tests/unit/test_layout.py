"""Where a newcomer finds things. The README's layout names every module and package of
sapo_node/ (and nothing that is not there), and imports go one way: no module imports,
even lazily, one that imports it back, and the lower rooms (train/, intake/, net/) never
reach up into the node, its operation or the experiment."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sapo_node"
SUBPACKAGES = ("train", "intake", "net", "ops")  # those whose files the layout lists
UPPER = ("sapo_node.node", "sapo_node.ops", "sapo_node.experiment", "sapo_node.cli")
LOWER = {  # room: the rooms it must not import
    "sapo_node.train": (*UPPER, "sapo_node.intake", "sapo_node.net"),
    "sapo_node.intake": UPPER,
    "sapo_node.net": (*UPPER, "sapo_node.train"),
}


def _block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return block.split("\nprotocol/", 1)[0].splitlines()


def _layout(package: str | None) -> list[str]:
    """The layout's rows of sapo_node/ itself (None) or of one of its sub-packages."""
    rows = _block()
    if package is not None:
        rows = rows[[r.startswith(f"  {package}/ ") for r in rows].index(True) + 1 :]
        rows = rows[: [not r.startswith("    ") for r in rows + [""]].index(True)]
    indent = "    " if package else "  "
    return [r for r in rows if r.startswith(indent) and not r.startswith(indent + " ")]


def _named(rows: list[str]) -> set[str]:
    named = set()
    for row in rows:
        files = row.strip().split("  ")[0]  # "a.py, b.py" before the description
        named |= {name.strip() for name in files.split(",")}
    return named


def _holds_code(init: Path) -> bool:
    """Whether a package's __init__.py holds more than its docstring."""
    body = ast.parse(init.read_text(encoding="utf-8")).body
    return len(body) > 1 or (len(body) == 1 and not isinstance(body[0], ast.Expr))


def _present(package: Path) -> set[str]:
    return {
        p.name + ("/" if p.is_dir() else "")
        for p in package.iterdir()
        if (
            p.suffix == ".py" and (p.name != "__init__.py" or package != PACKAGE and _holds_code(p))
        )
        or (p.is_dir() and (p / "__init__.py").exists())
    }


def test_the_readme_layout_names_every_module_of_the_package() -> None:
    named, present = _named(_layout(None)), _present(PACKAGE)
    assert present - named == set(), "modules the README's layout does not name"
    assert named - present == set(), "names in the README's layout that are not there"


def test_the_readme_layout_names_every_module_of_each_room() -> None:
    for package in SUBPACKAGES:
        named, present = _named(_layout(package)), _present(PACKAGE / package)
        assert present - named == set(), f"{package}/ modules the README does not name"
        assert named - present == set(), f"names under {package}/ in the README not there"


def test_the_layout_rows_are_files_then_what_they_hold() -> None:
    for package in (None, *SUBPACKAGES):
        indent = "    " if package else "  "
        for row in _layout(package):
            pattern = indent + r"[a-z_/]+(\.py)?(, [a-z_/]+(\.py)?)*  +\S"
            assert re.match(pattern, row), row


def _imports() -> dict[str, set[str]]:
    """Each module of sapo_node and the modules of sapo_node it imports, lazily or not."""
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("sapo_node"):
                found |= {n.module, *(f"{n.module}.{a.name}" for a in n.names)}
            elif isinstance(n, ast.Import):
                found |= {a.name for a in n.names}
        graph[name] = {m for m in found if m in modules and m not in (name, "sapo_node")}
    return graph


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _imports()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module) :]))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_lower_rooms_do_not_import_the_upper_ones() -> None:
    for module, targets in _imports().items():
        for room, banned in LOWER.items():
            if module == room or module.startswith(room + "."):
                wrong = {t for t in targets if t.startswith(banned)}
                assert wrong == set(), f"{module} imports {sorted(wrong)}"
