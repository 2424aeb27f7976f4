"""Where a newcomer finds things. The README's layout names every module and package of
sapo_node/ (and nothing that is not there), and imports go one way: no module imports,
even lazily, one that imports it back, and every import goes down the layers of
``LAYERS``, never up or sideways."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sapo_node"
SUBPACKAGES = ("train", "intake", "net", "ops")  # those whose files the layout lists
# The layers of sapo_node/, lowest first: a module imports only modules of its own unit
# (a top-level module, or a package with all its modules) or of a lower layer, never one
# of its own layer or above. A unit is named by its path under sapo_node; the longest
# name that matches a module is its unit, so intake.wire, the protocol's messages, sits
# below the config that checks a swarm file's version and shard count against it, while
# the rest of intake/ sits above it. Units of one layer do not know each other: the
# peer-checking intake/ and the training train/ stay apart.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("addresses", "atomic", "dialaddr", "logs", "metrics", "samples", "safe_verifiers", "sandbox"),
    ("checkpoint", "tasks"),
    ("datadir", "intake.wire"),
    ("options",),
    ("swarmfile",),
    ("config",),
    ("curriculum", "flags", "intake", "train"),
    ("evaluate", "groups", "net", "share", "solver"),
    ("record",),
    ("node",),
    ("build",),
    ("ops",),
    ("experiment", "local_swarm"),
    ("cli",),
)


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


def _unit(module: str) -> str:
    """The unit of ``module`` in ``LAYERS``: the longest name of them it lies in."""
    units = [u for layer in LAYERS for u in layer]
    name = module.removeprefix("sapo_node.")
    found = [u for u in units if name == u or name.startswith(u + ".")]
    assert found, f"{module} is in no layer: add it to LAYERS"
    return max(found, key=len)


def test_every_import_goes_down_the_layers() -> None:
    level = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    wrong = []
    for module, targets in sorted(_imports().items()):
        if module == "sapo_node":
            continue
        unit = _unit(module)
        for target in sorted(targets):
            to = _unit(target)
            if to != unit and level[to] >= level[unit]:
                wrong.append(f"{module} (layer {level[unit]}) imports {target} (layer {level[to]})")
    assert wrong == [], "imports up or across the layers:\n" + "\n".join(wrong)


def test_the_layers_name_only_what_is_there() -> None:
    modules = {m.removeprefix("sapo_node.") for m in _imports()}
    for unit in (u for layer in LAYERS for u in layer):
        assert any(m == unit or m.startswith(unit + ".") for m in modules), unit
