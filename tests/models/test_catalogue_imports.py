"""The model catalogue sits below latency/ and disagg/: no import between those two, none upward from models/.

Every ``import``/``from ... import`` in the files (lazy ones inside functions included) is read with
``ast``, so a lazy import cannot hide an arrow.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "dynlab"


def _imports(package: str) -> set[str]:
    found = set()
    for path in (ROOT / package).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return {name for name in found if name == "dynlab" or name.startswith("dynlab.")}


def test_models_imports_only_itself_and_errors():
    assert {m for m in _imports("models") if not m.startswith("dynlab.models")} <= {"dynlab.errors"}


@pytest.mark.parametrize("package, other", [("latency", "dynlab.disagg"), ("disagg", "dynlab.latency")])
def test_no_import_between_latency_and_disagg(package, other):
    assert not {m for m in _imports(package) if m == other or m.startswith(other + ".")}


def test_old_import_names_still_work():
    from dynlab.disagg import cost
    from dynlab.latency import hardware
    from dynlab.models import capacity, config, kv, spec

    assert cost.kv_shape_from_config is kv.kv_shape_from_config
    assert cost.ModelConfigError is config.ModelConfigError
    assert hardware.model_spec is spec.model_spec and hardware.kv_blocks is capacity.kv_blocks
