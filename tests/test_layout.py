"""The size limits of the engine and KV layers (issue 23): no module in ``dynlab/engine/`` or
``dynlab/kv/`` over 450 lines, no function (or method) over 60 lines (its ``def`` to its last
line, docstring included, counted with :mod:`ast`)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "dynlab"
FOLDERS = ("engine", "kv")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60

#: ``"folder/module.py"`` -> reason, for a module allowed over MAX_MODULE_LINES
MODULE_EXCEPTIONS: dict = {}
#: ``"folder/module.py:qualified.name"`` -> reason, for a function allowed over MAX_FUNCTION_LINES
FUNCTION_EXCEPTIONS: dict = {}


def _modules():
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def function_lengths(source: str) -> dict:
    """``qualified name -> lines`` of every function and method in ``source`` (nested ones too)."""
    out: dict = {}

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out[name] = child.end_lineno - child.lineno + 1
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def test_function_lengths_counts_def_to_last_line():
    src = ("def f(x):\n    '''doc'''\n    return x\n\n"
           "class C:\n    def m(self):\n        def g():\n            pass\n        return 1\n")
    assert function_lengths(src) == {"f": 3, "C.m": 4, "C.m.g": 2}


@pytest.mark.parametrize("path", _modules(), ids=_name)
def test_module_within_line_limit(path):
    lines = len(path.read_text().splitlines())
    if _name(path) in MODULE_EXCEPTIONS:
        return
    assert lines <= MAX_MODULE_LINES, f"{_name(path)}: {lines} lines (> {MAX_MODULE_LINES}): split it"


@pytest.mark.parametrize("path", _modules(), ids=_name)
def test_functions_within_line_limit(path):
    long = {name: n for name, n in function_lengths(path.read_text()).items()
            if n > MAX_FUNCTION_LINES and f"{_name(path)}:{name}" not in FUNCTION_EXCEPTIONS}
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_exceptions_are_still_needed():
    """An exception whose module or function is back within the limit is removed from the list."""
    for key in MODULE_EXCEPTIONS:
        assert len((ROOT / key).read_text().splitlines()) > MAX_MODULE_LINES, key
    for key in FUNCTION_EXCEPTIONS:
        module, name = key.split(":")
        assert function_lengths((ROOT / module).read_text()).get(name, 0) > MAX_FUNCTION_LINES, key
