"""The package's modules import only modules of lower layers (client/python/README.md,
"Layers"): no import circle, no upward import. Read from the sources with ast."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pg_idempotency"

# Bottom first; a module may import the modules of the layers before its own.
LAYERS = [
    ["_protocol", "_wire"],
    ["http", "fault"],
    ["_common", "_stream"],
    ["_transactional_core", "_batch", "_lease_core", "_router_core"],
    ["async_transactional", "transactional", "async_lease", "lease", "async_router", "router"],
    ["_async_middleware", "_middleware"],
    ["wsgi", "asgi", "django"],
    ["__init__"],
]
LAYER = {name: number for number, names in enumerate(LAYERS) for name in names}


def imports(path: Path) -> set:
    """The package's modules that ``path`` imports (relative imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:
                found.update(alias.name for alias in node.names)
            else:
                found.add(node.module.split(".")[0])
    return found


def test_every_module_has_a_layer():
    assert {path.stem for path in PACKAGE.glob("*.py")} == set(LAYER)


def test_imports_point_down():
    upward = []
    for path in sorted(PACKAGE.glob("*.py")):
        for target in sorted(imports(path)):
            if LAYER[target] >= LAYER[path.stem]:
                upward.append(f"{path.stem} -> {target}")
    assert upward == []


def test_the_check_finds_an_upward_import(tmp_path):
    module = tmp_path / "http.py"
    module.write_text("from . import _wire\nfrom .transactional import Client\n", encoding="utf-8")
    assert imports(module) == {"_wire", "transactional"}
    assert LAYER["transactional"] >= LAYER["http"]
