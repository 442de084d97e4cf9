"""calibrate's progress: the library calls the caller's callback once per replay with the stage it is in, and
prints nothing; the CLI shows a tqdm bar on stderr (dynlab.cli.common.progress_bar: only on a terminal)."""
from __future__ import annotations

import csv
from dataclasses import replace

import pytest
from click.testing import CliRunner

import dynlab.calibrate.fit as fit_module
from dynlab.calibrate.fit import calibrate
from dynlab.calibrate.formats import MeasuredPoint
from dynlab.cli import main
from dynlab.engine.config import SimConfig

pytest.importorskip("scipy")

CONFIG = SimConfig(timing=True, latency_model="linear", model="llama-3.1-8b", gpu="h100")


def _points():
    return [MeasuredPoint(source=f"c{c}", max_concurrency=c, num_prompts=8, random_input_len=200,
                          random_output_len=20, median_ttft_ms=50.0 * c, median_tpot_ms=8.0 + c) for c in (1, 2, 4)]


def test_progress_is_told_of_every_replay_with_its_stage(monkeypatch, capsys):
    replays = []
    real = fit_module.replay
    monkeypatch.setattr(fit_module, "replay", lambda *a, **k: replays.append(1) or real(*a, **k))
    stages = []
    points = _points()
    out = calibrate(points, [CONFIG] * 3, folds=3, max_nfev=1, progress=stages.append)
    assert len(stages) == len(replays) > 0
    assert stages[0] == "fit" and stages[-1] == "fold 3/3"
    assert {s for s in stages} == {"fit", "fold 1/3", "fold 2/3", "fold 3/3"}
    assert stages == sorted(stages, key=["fit", "fold 1/3", "fold 2/3", "fold 3/3"].index)
    assert capsys.readouterr() == ("", "")
    replays.clear()
    assert calibrate(points, [CONFIG] * 3, folds=3, max_nfev=1) == out  # no callback: the same fit
    assert replays


class _Bar:
    made = []

    def __init__(self, total, desc, unit, **kw):
        self.args, self.updates, self.descs = (total, desc, unit), 0, []
        _Bar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.updates += n

    def set_postfix_str(self, text, refresh=True):
        self.descs.append(text)


def _file(tmp_path):
    path = tmp_path / "p.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "gpu", "max_concurrency", "num_prompts", "random_input_len", "random_output_len",
                    "median_ttft_ms", "median_tpot_ms"])
        for c in (1, 2, 4):
            w.writerow(["llama-3.1-8b", "h100", c, 8, 200, 20, 50.0 * c, 8.0 + c])
    return str(path)


def test_the_cli_drives_a_progress_bar_and_prints_none_off_a_terminal(tmp_path, monkeypatch):
    import dynlab.cli.calibrate as cli_calibrate

    path = _file(tmp_path)
    r = CliRunner().invoke(main, ["calibrate", path, "--folds", "3", "--output-format", "json"])
    assert r.exit_code == 0, r.output
    assert r.stderr == ""  # CliRunner's stderr is no terminal: no bar
    _Bar.made.clear()
    monkeypatch.setattr(cli_calibrate, "progress_bar", _Bar)
    r = CliRunner().invoke(main, ["calibrate", path, "--folds", "3", "--output-format", "json"])
    assert r.exit_code == 0, r.output
    [bar] = _Bar.made
    assert bar.args == (None, "calibrate", "replay") and bar.updates > 0
    assert bar.descs[0] == "fit" and bar.descs[-1] == "fold 3/3"
    assert len(bar.descs) == bar.updates  # the stage told with every replay
