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


def test_a_picked_loop_block_is_rerun_with_its_input_files(tmp_path):
    """A shell loop shown in a doc (the Gemma 3 blocks of docs/engine.md and docs/tiers.md) is run as its
    dynlab commands, in a folder holding its inputs, and shows the keys it picks, one line per run."""
    shown = "for w in 2 3; do dynlab sim --workload chat.json --workers $w | jq -c '{workers, requests}'; done"
    block = docs_tables.Picked("doc.md", shown, runs=tuple(f"dynlab sim --workload chat.json --workers {w}"
                                                           for w in (2, 3)),
                               keys=("workers", "requests", "no_such_key"), inputs=("examples/chat.json",))
    (tmp_path / "doc.md").write_text(f"```\n$ {shown}\n{{\"workers\": 9}}\n```\n")
    assert docs_tables.update(block, root=tmp_path, check=True) != []
    docs_tables.update(block, root=tmp_path)
    requests = json.loads((ROOT / "examples" / "chat.json").read_text())["requests"]  # 3000
    assert (tmp_path / "doc.md").read_text() == (f"```\n$ {shown}\n{{\"workers\": 2, \"requests\": {requests}}}\n"
                                                 f"{{\"workers\": 3, \"requests\": {requests}}}\n```\n")


def test_the_gemma_loops_of_engine_and_tiers_are_registered():
    picked = {b.path for b in docs_tables.BLOCKS if isinstance(b, docs_tables.Picked)}
    assert {"docs/engine.md", "docs/tiers.md"} <= picked
    for block in docs_tables.BLOCKS:  # every input a block copies is in the repository
        assert all((ROOT / name).is_file() for name in getattr(block, "inputs", ()))
