"""The HTML report in a real browser: headless Chromium (Debian's package; `.ci/run` installs it) opens
generated reports, and the test checks that they render with no console error and no network request,
and saves a full-page screenshot whose pixels are not blank.

Without Chromium the tests are skipped, except under CI (``CI`` set), where they fail: CI installs it.
The browser is driven over the DevTools protocol on a pipe (tests/browser.py), no dependency needed.
"""
from __future__ import annotations

import io
import os

import pytest
from click.testing import CliRunner

from browser import Browser, find_chromium
from dynlab.cli import main
from dynlab.report import Run, build_report

from test_report import COUNTED, RECORDS, TIMED, rec

pytestmark = pytest.mark.browser

FIGURES = "document.querySelectorAll('figure svg').length"
COUNTS = {"figures": FIGURES, "svg_drawn": "[...document.querySelectorAll('figure svg')]"
          ".filter(s => s.getBoundingClientRect().width > 100).length",
          "title": "document.title", "tables": "document.querySelectorAll('table').length",
          # the headline table's width and its box's: a table wider than the page is cut off (issue 43 item 8)
          "headline_width": "document.querySelector('#headline + div table').scrollWidth",
          "headline_box": "document.querySelector('#headline + div').clientWidth"}


@pytest.fixture(scope="module")
def browser():
    path = find_chromium()
    if path is None:
        message = "Chromium is not installed (Debian: apt-get install chromium; .ci/run does it)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must install it")
        pytest.skip(message)
    with Browser(path) as b:
        yield b


def _pixels(png: bytes):
    from matplotlib import image

    return image.imread(io.BytesIO(png), format="png")


def _not_blank(png: bytes) -> float:
    """The share of pixels that are not the page's background colour (the top-left pixel's)."""
    px = _pixels(png)[..., :3]
    background = px[0, 0]
    return float((abs(px - background).sum(axis=-1) > 0.05).mean())


def _open(browser, path, tmp_path, name):
    """Open the report; its screenshot goes to ``tmp_path``, and to ``$DYNLAB_SCREENSHOTS`` when set (for
    a CI run to keep)."""
    page = browser.open(path.as_uri(), evaluate=COUNTS)
    shot = tmp_path / f"{name}.png"
    shot.write_bytes(page.png)
    if os.environ.get("DYNLAB_SCREENSHOTS"):
        os.makedirs(os.environ["DYNLAB_SCREENSHOTS"], exist_ok=True)
        with open(os.path.join(os.environ["DYNLAB_SCREENSHOTS"], f"{name}.png"), "wb") as fh:
            fh.write(page.png)
    return page, shot


def test_a_real_compare_report_renders_offline(browser, tmp_path):
    out = tmp_path / "compare.html"
    res = CliRunner().invoke(main, ["compare", "--timing", "--modes", "rr,kv-cost", "--workers", "3", "--quiet",
                                    "--slo-ttft-ms", "500", "--slo-tpot-ms", "50", "--format", "json",
                                    "--report", str(out)])
    assert res.exit_code == 0, res.output
    page, shot = _open(browser, out, tmp_path, "compare")
    assert page.errors() == [] and page.console == [], page.console
    assert page.requests == [], page.requests
    assert page.values["figures"] == page.values["svg_drawn"] >= 3, page.values
    assert _not_blank(page.png) > 0.02, shot
    assert _pixels(page.png).shape[0] > 900  # the whole page, taller than one screen
    # 15 headline columns (goodput with the SLOs) fit a 1,200 px window without scrolling
    assert page.values["headline_width"] <= page.values["headline_box"], page.values


def test_records_pd_and_sweep_figures_render_offline(browser, tmp_path):
    pd = [rec(i, 1 + i % 2, 3.0 * i, 3.0 * i + 1, 3.0 * i + 9, 3.0 * i + 40, out=5, prefill_worker=0,
              decode_worker=1 + i % 2, transfer_start_ms=3.0 * i + 9, transfer_end_ms=3.0 * i + 12) for i in range(40)]
    cells = [Run(f"workers={w} capacity={c}", dict(COUNTED, block_hit_rate=w / c), cell={"workers": w, "capacity": c})
             for w in (2, 4) for c in (10, 20)]
    out = tmp_path / "all.html"
    out.write_text(build_report([Run("kv-cost", TIMED), Run("pd", TIMED)] + cells,
                                {"kv-cost": RECORDS, "pd": pd}))
    page, shot = _open(browser, out, tmp_path, "all")
    assert page.console == [] and page.requests == [], (page.console, page.requests)
    assert page.values["figures"] == page.values["svg_drawn"] >= 7, page.values
    assert _not_blank(page.png) > 0.02, shot


def test_the_checks_are_not_vacuous(browser, tmp_path):
    # a page that logs an error and one that fetches from the network are caught
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><p>x</p><img src="http://127.0.0.1:9/x.png">'
                   '<script>console.error("boom")</script></body></html>')
    page = browser.open(bad.as_uri())
    assert ("error", "boom") in page.console
    assert "http://127.0.0.1:9/x.png" in page.requests
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    assert _not_blank(browser.open(blank.as_uri()).png) == 0.0
