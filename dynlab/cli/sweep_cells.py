"""``dynlab sweep``'s cells: the results file to resume from and the run of the cells still to do, each result
written as it arrives (:func:`run_cells`). Split from :mod:`dynlab.cli.sweep`, which parses and checks the grid."""
from __future__ import annotations

import contextlib
import json
import sys

import click

from dynlab.errors import DynlabError
from dynlab.sweep import CellError, ResultsFile, cell_key, execute, record_line


def open_results(out, resume, cells, configs) -> tuple:
    """``(results file or None, the cells to run)``: with ``--resume``, the cells ``out`` already holds are skipped."""
    results_file = ResultsFile(out) if out else None
    done: set[str] = set()
    if results_file is not None and resume:
        results_file.scan()
        done = results_file.done()
    return results_file, [(cell, config) for cell, config in zip(cells, configs) if cell_key(cell) not in done]


def run_cells(todo: list, executor, jobs, ray_address, results_file, results: dict, in_grid: set,
               quiet: bool) -> None:
    """Run the ``(cell, config)`` pairs of ``todo``; write each result to ``results_file`` (or stdout) as
    it arrives and into ``results`` (cell key -> result)."""
    out = results_file.path if results_file is not None else None
    with contextlib.ExitStack() as stack:
        # execute() loads and checks the traces, checks Ray and its address, and starts the pool (forked)
        # or Ray, all before the results file is opened: a bad trace or an unreachable cluster writes
        # nothing, and the workers do not inherit the file's lock.
        try:
            runs = stack.enter_context(execute([c for _, c in todo], executor, jobs, ray_address))
        except ValueError as exc:  # a trace the cells' options cannot read (e.g. --hash on named blocks)
            raise click.UsageError(str(exc)) from None
        if results_file is not None:
            stack.enter_context(results_file)  # lock and re-read: a cell another sweep added is not written twice
            results.update({k: r for k, (_, r) in results_file.records.items()})
            if results_file.dropped_partial and not quiet:
                click.echo(f"{out}: dropping an incomplete last line (an interrupted write)", err=True)
            stray = len(set(results_file.records) - in_grid)
            if stray and not quiet:
                click.echo(f"{out}: {stray} record(s) are not cells of this grid; kept", err=True)
        from tqdm import tqdm

        bar = stack.enter_context(tqdm(total=len(todo), unit="cell", desc="sweep", file=sys.stderr,
                                       disable=quiet or not todo or not sys.stderr.isatty(), leave=False))
        try:
            for i, result in runs:
                cell = todo[i][0]
                if results_file is not None:
                    results_file.append(cell, result)
                else:
                    click.echo(record_line(cell, result))
                results[cell_key(cell)] = result
                bar.update(1)
        except CellError as exc:
            raise DynlabError(f"cell {json.dumps(todo[exc.index][0])}: {exc}") from None
