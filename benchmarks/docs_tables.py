"""Regenerate the docs' command outputs, so that a table or an error pasted in README/docs cannot go stale.

Each entry of :data:`BLOCKS` names a file and a ``dynlab`` command shown in it as ``$ dynlab ...``; its
output is the lines that follow, up to the next ``$ `` line or the end of the code block. This script
runs each command (in this process, through click's test runner, in an empty temporary folder, stdout
and stderr together as a terminal shows them; ``compare`` without ``--format`` as on a terminal: a
table) and writes the output it prints in place of the old one. A :class:`Picked` entry is a shell loop
shown as one ``$ for ...`` line that picks keys of each run's JSON: its runs are given one by one. It also rewrites the option tables of
:data:`OPTION_TABLES` (between their two markers) from the declarations of ``dynlab/engine/options.py``.

Usage::

    python benchmarks/docs_tables.py              # rewrite every block (the timed ones take minutes)
    python benchmarks/docs_tables.py --cheap      # only the blocks that take about a second
    python benchmarks/docs_tables.py --check      # exit 1 and show a diff when a block is stale
    python benchmarks/docs_tables.py --only docs/engine.md   # one file's blocks

``tests/test_docs_tables.py`` runs ``--check`` on the cheap blocks. Prose around a table that quotes
its numbers is not rewritten: read it again after a table changes.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Block:
    """One command shown in ``path`` (relative to the repository) and whether it runs in about a second.

    ``image``: where in the repository the figure the command writes (its ``--plot`` file) is kept, so
    that the picture beside a table comes from the same run as the table.
    """

    path: str
    command: str
    cheap: bool = False
    image: str | None = None


@dataclass(frozen=True)
class Picked:
    """A shell loop shown in ``path`` as ``$ {command}`` that prints a few keys of each run's JSON, one line each.

    ``runs``: the ``dynlab`` commands the loop runs, in order (stderr thrown away, as its ``2>/dev/null``);
    ``keys``: the keys it picks (a key a run lacks is left out, as ``if k in d``); ``inputs``: files of the
    repository copied (under their own names) into the folder the runs start in (the loop's workload file).
    The Gemma 3 blocks of docs/engine.md and docs/tiers.md went stale twice unseen when this script knew
    only single ``dynlab`` lines.
    """

    path: str
    command: str
    runs: tuple[str, ...]
    keys: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    cheap: bool = False
    image: str | None = None


BLOCKS = (
    Block("README.md", "dynlab compare --trace mooncake-conversation --workers 8 --capacity 4096 "
          "--modes rr,random,kv,kv-events", cheap=True),
    Block("README.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--modes rr,kv,kv-events,kv-cost,cache-aware"),
    Block("docs/commands.md", "dynlab sweep --grid mode=rr,kv --grid worker=2,4", cheap=True),
    Block("docs/commands.md", "dynlab sweep --grid mode=rr,kv --grid capacity=512,-1", cheap=True),
    Block("docs/commands.md", "dynlab sweep --grid mode=kv-cost,rr --grid opt.temperature=0,0.5", cheap=True),
    Block("docs/limits.md", "dynlab sim --workers 1000000000", cheap=True),
    Block("docs/limits.md", "dynlab scenario --docs 100000000", cheap=True),
    Block("docs/limits.md", "dynlab sim --timing --model gpt-oss-120b --tp 2 --ep 2", cheap=True),
    Block("docs/limits.md", "dynlab sim --trace mooncake-conversation --duration 1e13", cheap=True),
    Block("docs/limits.md", "dynlab sim --trace mooncake-conversation --duration 1e8", cheap=True),
    Block("docs/tiers.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--cpu-capacity 0,60000 --modes kv-cost --format table"),
    Block("docs/tiers.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--cpu-capacity 20000,60000 --cpu-write compute --modes kv-cost --format table"),
    Block("docs/tiers.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--cpu-capacity 20000,60000 --cpu-write evict --modes kv-cost --format table"),
    Block("README.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--modes rr,kv-events,kv-cost --report main.html"),
    Block("docs/report.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--modes rr,kv-events,kv-cost --report main.html"),
    Block("docs/engine.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--modes rr,kv,kv-events,kv-cost,cache-aware --plot ttft.png", image="docs/images/ttft.png"),
    Block("docs/engine.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing --time-scale 0.5 "
          "--modes rr,least-loaded,kv-events,kv-cost,cache-aware --slo-ttft-ms 2000 --slo-tpot-ms 50"),
    Block("docs/engine.md", "dynlab sim --trace mooncake-conversation --timing --model gpt-oss-120b --gpu h200 --mode kv"),
    Block("docs/engine.md", "dynlab sim --trace mooncake-conversation --timing --model gpt-oss-120b --gpu h200 --mode kv "
          "--spec-method eagle3 --spec-tokens 3"),
    Block("docs/routing.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing --mode kv-cost "
          "--routers 1,2,4"),
    Block("docs/routing.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing --mode kv-cost "
          "--routers 2,4 --opt shared_load=true"),
    Block("docs/routing.md", "dynlab compare --trace mooncake-conversation --workers 8 --timing "
          "--modes kv-cost,weighted"),
    Block("docs/disagg.md", "dynlab compare --trace mooncake-conversation --timing --mode kv --split 8:0,6:2,4:4 "
          "--slo-ttft-ms 2000 --slo-tpot-ms 50 --format table --quiet --plot out/disagg_split.png",
          image="docs/images/disagg_split.png"),
    Picked("docs/engine.md", "for m in gemma-3-27b gemma-3-27b-full.json; do dynlab sim --timing --model $m "
           "--workload window-chat.json --workers 2 2>/dev/null | python -c \"import json,sys; d=json.load(sys.stdin); "
           "print(json.dumps({k: d[k] for k in ('kv_blocks','kv_blocks_source','peak_kv_blocks','prefix_hit_rate',"
           "'preemptions','ttft_ms','tpot_ms')}))\"; done",
           runs=tuple(f"dynlab sim --timing --model {m} --workload window-chat.json --workers 2"
                      for m in ("gemma-3-27b", "gemma-3-27b-full.json")),
           keys=("kv_blocks", "kv_blocks_source", "peak_kv_blocks", "prefix_hit_rate", "preemptions", "ttft_ms",
                 "tpot_ms"),
           inputs=("examples/window-chat.json", "examples/models/gemma-3-27b-full.json")),
    Picked("docs/tiers.md", "for t in \"\" \"--cpu-memory-gb 100\"; do dynlab sim --timing --model gemma-3-27b "
           "--workload window-chat.json --workers 2 --capacity 10000 $t 2>/dev/null | python -c \"import json,sys; "
           "d=json.load(sys.stdin); print(json.dumps({k: d[k] for k in ('kv_blocks','cpu_kv_blocks',"
           "'cpu_kv_blocks_source','prefix_hit_rate','cpu_hit_blocks','preemptions','ttft_ms') if k in d}))\"; done",
           runs=tuple(f"dynlab sim --timing --model gemma-3-27b --workload window-chat.json --workers 2 "
                      f"--capacity 10000{t}" for t in ("", " --cpu-memory-gb 100")),
           keys=("kv_blocks", "cpu_kv_blocks", "cpu_kv_blocks_source", "prefix_hit_rate", "cpu_hit_blocks",
                 "preemptions", "ttft_ms"),
           inputs=("examples/window-chat.json",)),
)


def run(command: str, image: str | None = None, inputs: tuple[str, ...] = ()) -> str:
    """What ``command`` (``dynlab ...``) prints, stdout then stderr, each line ending in a newline.

    With ``image`` (a path in the repository), the file the command's ``--plot`` wrote replaces it;
    ``inputs``: files of the repository copied into the folder it runs in.
    """
    result = _invoke(command, image, inputs)
    text = result.stdout + result.stderr
    return text if text.endswith("\n") or not text else text + "\n"


def run_picked(block: Picked) -> str:
    """What ``block``'s shell loop prints: for each of its runs, the keys it picks of the run's JSON, one line."""
    lines = []
    for command in block.runs:
        result = json.loads(_invoke(command, None, block.inputs).stdout)
        lines.append(json.dumps({k: result[k] for k in block.keys if k in result}) + "\n")
    return "".join(lines)


def _invoke(command: str, image: str | None, inputs: tuple[str, ...]):
    """Run ``command`` through click's test runner in an empty temporary folder holding ``inputs``."""
    from click.testing import CliRunner

    from dynlab.cli import main

    args = shlex.split(command)
    if args[0] != "dynlab":
        raise ValueError(f"not a dynlab command: {command!r}")
    args = args[1:]
    if args[0] == "compare" and "--format" not in args:
        args += ["--format", "table"]  # what a terminal shows
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        for name in inputs:
            shutil.copyfile(ROOT / name, Path(tmp) / Path(name).name)
        os.chdir(tmp)
        for flag, value in zip(args, args[1:]):  # the folders of the files a command writes (--plot out/x.png)
            if flag in ("--plot", "--report", "--out", "--timeline") and os.path.dirname(value):
                os.makedirs(os.path.dirname(value), exist_ok=True)
        try:
            result = CliRunner().invoke(main, args)
        finally:
            os.chdir(old)
        if image is not None and result.exception is None:
            _keep(Path(tmp) / args[args.index("--plot") + 1], ROOT / image)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise RuntimeError(f"{command}: {result.exception!r}")
    return result


def _keep(made: Path, kept: Path) -> None:
    """Replace ``kept`` by the figure ``made`` (atomically: a failed copy leaves the old figure)."""
    from dynlab.atomic import replace_file

    data = made.read_bytes()
    replace_file(str(kept), lambda name: Path(name).write_bytes(data))


def _span(lines: list[str], command: str, path: str) -> tuple[int, int]:
    """``(first, end)``: the output lines of ``command`` in ``lines`` are ``lines[first:end]``."""
    shown = f"$ {command}\n"
    try:
        start = lines.index(shown)
    except ValueError:
        raise SystemExit(f"{path}: no line '$ {command}'") from None
    end = start + 1
    while end < len(lines) and not lines[end].startswith(("$ ", "```")):
        end += 1
    return start + 1, end


def update(block: Block | Picked, root: Path = ROOT, check: bool = False) -> list[str]:
    """Regenerate one block; returns the diff (empty when it was current). Writes unless ``check``."""
    path = root / block.path
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    first, end = _span(lines, block.command, block.path)
    if isinstance(block, Picked):
        new = run_picked(block).splitlines(keepends=True)
    else:
        new = run(block.command, None if check else block.image).splitlines(keepends=True)
    old = lines[first:end]
    diff = list(difflib.unified_diff(old, new, f"{block.path} (shown)", f"{block.path} (the command now)"))
    if diff and not check:
        from dynlab.atomic import replace_file

        text = "".join(lines[:first] + new + lines[end:])
        replace_file(str(path), lambda name: Path(name).write_text(text, encoding="utf-8"))
    return diff


#: the docs' option tables (:func:`dynlab.engine.option_spec.option_table`): file -> the command whose options it lists
OPTION_TABLES = {"docs/commands.md": "sim"}
_TABLE_START = "<!-- option table: generated from dynlab/engine/options.py by benchmarks/docs_tables.py -->\n"
_TABLE_END = "<!-- end of option table -->\n"


def update_option_table(path: str, command: str, root: Path = ROOT, check: bool = False) -> list[str]:
    """Regenerate the option table of ``command`` between its two markers in ``path``; returns the diff (empty when it
    was current). Writes unless ``check``."""
    from dynlab.engine.option_spec import option_table
    from dynlab.engine.options import OPTIONS

    text = (root / path).read_text(encoding="utf-8")
    head, start, rest = text.partition(_TABLE_START)
    old, end, tail = rest.partition(_TABLE_END)
    if not start or not end:
        raise SystemExit(f"{path}: no option table markers")
    new = option_table(OPTIONS, command) + "\n"
    diff = list(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     f"{path} (shown)", f"{path} (the declarations now)"))
    if diff and not check:
        from dynlab.atomic import replace_file

        replace_file(str(root / path), lambda name: Path(name).write_text(head + start + new + end + tail,
                                                                           encoding="utf-8"))
    return diff


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block is stale")
    ap.add_argument("--cheap", action="store_true", help="only the blocks that run in about a second")
    ap.add_argument("--only", metavar="PATH", help="only the blocks of this file (README.md, docs/engine.md, ...)")
    args = ap.parse_args(argv)
    stale = 0
    for path, command in OPTION_TABLES.items():  # generated from the declarations: cheap
        if args.only and path != args.only:
            continue
        diff = update_option_table(path, command, check=args.check)
        stale += bool(diff)
        sys.stdout.writelines(diff)
        print(f"{path}: {'stale' if diff and args.check else 'updated' if diff else 'current'}: the option table of "
              f"{command}", file=sys.stderr)
    for block in BLOCKS:
        if (args.cheap and not block.cheap) or (args.only and block.path != args.only):
            continue
        diff = update(block, check=args.check)
        if diff:
            stale += 1
            sys.stdout.writelines(diff)
        print(f"{block.path}: {'stale' if diff and args.check else 'updated' if diff else 'current'}: "
              f"$ {block.command}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
