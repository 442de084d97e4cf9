"""The docs' cheap command outputs (README's count-based compare table, docs/commands.md's sweep errors,
docs/limits.md's limit errors) are what the commands print now: benchmarks/docs_tables.py regenerates
them, and this test fails when one is stale (run ``python benchmarks/docs_tables.py --cheap``)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _docs_tables():
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "benchmarks" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_tables"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


docs_tables = _docs_tables()
CHEAP = [b for b in docs_tables.BLOCKS if b.cheap]


def test_the_readme_main_table_is_among_the_checked_blocks():
    assert any(b.path == "README.md" and "--capacity 4096" in b.command for b in CHEAP)


@pytest.mark.parametrize("block", CHEAP, ids=lambda b: f"{b.path}: {b.command}")
def test_a_docs_block_is_what_its_command_prints(block):
    diff = docs_tables.update(block, check=True)
    assert diff == [], "stale; run python benchmarks/docs_tables.py --cheap\n" + "".join(diff)


def test_check_reports_a_stale_block_and_update_rewrites_only_it(tmp_path):
    block = docs_tables.Block("doc.md", "dynlab sim --workers 1000000000", cheap=True)
    (tmp_path / "doc.md").write_text("before\n```\n$ dynlab sim --workers 1000000000\nError: old\n```\nafter\n")
    assert docs_tables.update(block, root=tmp_path, check=True) != []
    assert "Error: old" in (tmp_path / "doc.md").read_text()  # --check writes nothing
    docs_tables.update(block, root=tmp_path)
    text = (tmp_path / "doc.md").read_text()
    assert text.startswith("before\n```\n$ dynlab sim --workers 1000000000\nError: --workers 1000000000 asks for")
    assert text.endswith("\n```\nafter\n") and text.count("\n") == 6
    assert docs_tables.update(block, root=tmp_path, check=True) == []


def test_the_committed_report_has_every_key_reproduce_writes():
    """docs/report/ is a committed `dynlab reproduce --with-samples` output: its JSON files are what
    reproduce computes now (bounded.json lacked keys it writes)."""
    from dynlab.labs import reproduce as lib

    result = lib.build(disagg=lib.sample_file("disagg"), offload=lib.sample_file("offload"), with_plots=False,
                       invocation="dynlab reproduce OUTDIR --with-samples")
    for name, artifact in result.artifacts.items():
        committed = ROOT / "docs" / "report" / name
        assert json.loads(committed.read_text()) == json.loads(artifact.text), name
