"""The REST API keeps one resource in one place (docs/architecture.md): a package per resource
under ``fleet/api/resources/``, view modules that define no serializer, one helper for the
documented error responses, and no module past 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "fleet" / "api"
MODULES = sorted(API.rglob("*.py"))
VIEW_MODULES = sorted((API / "resources").glob("*/views.py"))


def _relative(path: Path) -> str:
    return str(path.relative_to(API.parent.parent))


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_no_api_module_is_over_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 400


@pytest.mark.parametrize("path", VIEW_MODULES, ids=_relative)
def test_a_view_module_defines_no_serializer(path: Path) -> None:
    tree = ast.parse(path.read_text())
    defined = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any("Serializer" in ast.unparse(base) for base in node.bases)
    ]
    inline = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("inline_serializer")
    ]
    assert (defined, inline) == ([], [])


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_error_responses_are_documented_through_the_one_helper(path: Path) -> None:
    if path == API / "common.py":
        return
    text = path.read_text()
    assert "OpenApiResponse(ErrorSerializer" not in text
    assert "def error_responses" not in text


def test_every_resource_is_a_package_with_its_serializers() -> None:
    packages = [p for p in (API / "resources").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert packages
    for package in packages:
        assert (package / "__init__.py").exists(), package.name
        assert (package / "serializers.py").exists() or (package / "views.py").exists()
    loose = {p.name for p in API.glob("*.py")}
    assert not {name for name in loose if name.startswith(("views", "serializers"))}
