"""The metrics chart as JupyterLab draws it in headless Chromium (Playwright).

A ``%%ddp`` cell with 4 CPU ranks logs 4,000 steps of a decaying noisy
loss, a warm-up and cosine learning rate, and an accuracy; the chart must
read well once the run is done: one panel per metric, step and value labels
that do not overlap and are not tiny, the loss on a log axis that says so,
and each rank's line visible. A second test draws 8 ranks (a history built
in the kernel, no launch): a mean line with a min-max band, and a rank's own
line when the pointer is on its legend row. Screenshots land in
``artifacts_dir()``; the tests wait on the page's content, never on time.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.lab import MS, Lab, shot
from tests.browser.test_panel_browser import open_and_run

pytestmark = pytest.mark.timeout(300)

STEPS = 4000
RUN_4_RANKS = f"""\
%%ddp --procs 4
import math, random, nbddp
noise = random.Random(rank)
for step in range({STEPS}):
    loss = 2.3 * math.exp(-step / 400) * (1 + 0.05 * rank) + 0.08 + 0.01 * noise.random()
    warm = min(1.0, (step + 1) / 200)
    lr = 1e-3 * warm * 0.5 * (1 + math.cos(math.pi * step / {STEPS}))
    acc = 0.95 - 0.85 * math.exp(-step / 700) + 0.01 * noise.random()
    nbddp.log(step=step, loss=loss, lr=lr, acc=acc)
print("finished", rank)
"""
EIGHT_RANKS = """\
import math, random
from IPython.display import HTML, display
from nbddp.display.chart import MetricHistory, chart_html
history = MetricHistory()
for step in range(10_000):
    for rank in range(8):
        noise = random.Random(step * 8 + rank).random()
        drift = 1.6 if rank == 5 and step > 6000 else 1.0
        history.add({"rank": rank, "step": step, "time": 0.0,
                     "loss": (3 * math.exp(-step / 900) + 0.05 + 0.02 * noise) * drift,
                     "grad_norm": 1 + 0.3 * math.sin(step / 300 + rank) + 0.1 * noise})
display(HTML(chart_html(history)))
"""

# Every text box inside an SVG panel, in page pixels: labels that overlap read badly.
TEXT_BOXES = """(svg) => Array.from(svg.querySelectorAll('text')).map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom,
            size: parseFloat(getComputedStyle(t).fontSize)};
})"""


def overlaps(boxes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of text labels whose boxes intersect (by more than a pixel's rounding)."""
    found = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > 1 and (
                min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > 1
            ):
                found.append((a["text"], b["text"]))
    return found


def readable_panels(chart: Locator) -> dict[str, list[dict[str, Any]]]:
    """Each panel's text boxes by metric, after checking they are big enough and apart."""
    panels = chart.locator("svg[data-metric]")
    found = {}
    for i in range(panels.count()):
        svg = panels.nth(i)
        box = svg.bounding_box()
        assert box is not None and box["width"] >= 250 and box["height"] >= 160, box
        texts = svg.evaluate(TEXT_BOXES)
        assert all(t["size"] >= 11 for t in texts), texts
        assert not overlaps(texts), overlaps(texts)
        found[str(svg.get_attribute("data-metric"))] = texts
    return found


def test_a_4000_step_run_of_4_ranks_reads_well(page: Page, lab_server: Lab) -> None:
    open_and_run(page, lab_server, "chart_4x4000.ipynb", ["%load_ext nbddp", RUN_4_RANKS])
    output = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
    expect(output).to_contain_text("finished 3", timeout=240 * MS)
    for rank in range(4):
        expect(output).to_contain_text(f"rank {rank} · done")
    chart = output.locator(".nbddp-metrics")
    expect(chart).to_contain_text(f"step {STEPS - 1}")  # the last rows are drawn
    chart.scroll_into_view_if_needed()
    shot(chart, "chart-4-ranks-4000-steps.png")

    panels = readable_panels(chart)
    assert list(panels) == ["loss", "lr", "acc"]
    # Side by side in the output area, beside JupyterLab's open file browser.
    tops = chart.locator("svg[data-metric]").evaluate_all(
        "svgs => svgs.map(s => s.getBoundingClientRect().top)"
    )
    assert len(set(tops)) == 1, tops
    for texts in panels.values():
        labels = {t["text"] for t in texts}
        assert {"1k", "2k", "3k", "step"} <= labels, labels
    loss = chart.locator('svg[data-metric="loss"]')
    expect(loss).to_have_attribute("data-scale", "log")
    expect(loss).to_contain_text("log scale")
    expect(chart.locator('svg[data-metric="acc"]')).to_have_attribute("data-scale", "linear")
    # At 4 ranks each rank has its own visible line, in its own colour.
    colours = loss.locator(".nbddp-rank-line").evaluate_all(
        "gs => gs.filter(g => getComputedStyle(g).display !== 'none')"
        ".map(g => g.querySelector('circle').getAttribute('fill'))"
    )
    assert len(set(colours)) == 4, colours
    # The learning rate is the same on every rank: one line, and the panel says so.
    expect(chart.locator('svg[data-metric="lr"]')).to_contain_text("all 4 ranks equal")


def test_8_ranks_draw_a_band_and_a_rank_on_demand(page: Page, lab_server: Lab) -> None:
    open_and_run(page, lab_server, "chart_8_ranks.ipynb", [EIGHT_RANKS])
    chart = page.locator(".jp-Cell").nth(0).locator(".jp-OutputArea .nbddp-metrics")
    expect(chart.locator("svg[data-metric]")).to_have_count(2, timeout=90 * MS)
    readable_panels(chart)
    loss = chart.locator('svg[data-metric="loss"]')
    expect(loss.locator("polygon.nbddp-band")).to_have_count(1)
    expect(loss.locator(".nbddp-mean-line")).to_have_count(1)
    rank5 = loss.locator('.nbddp-rank-line[data-rank="5"]')
    expect(rank5).to_be_hidden()
    shot(chart, "chart-8-ranks-band.png")

    chart.locator('.nbddp-key[data-rank="5"]').hover()
    expect(rank5).to_be_visible()
    shot(chart, "chart-8-ranks-hover-rank-5.png")

    # The dark theme: labels take the theme's text colour, lines stay distinct.
    page.evaluate(
        "window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})"
    )
    expect(page.locator("body[data-jp-theme-light='false']")).to_have_count(1, timeout=30 * MS)
    page.mouse.move(0, 0)
    expect(rank5).to_be_hidden()
    shot(chart, "chart-8-ranks-dark.png")
