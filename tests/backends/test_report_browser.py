"""The HTML report in a real browser (headless Chromium, Debian's ``chromium`` package): the
page renders, the DOM Chromium builds holds the stage table and every figure, and a screenshot
is not blank. Skipped where Chromium is absent, unless ``MTPP_REQUIRE_CHROMIUM=1`` (set by
.ci/run, which installs it), which makes its absence a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.backends.test_report_html import inference_case, parse

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("MTPP_REQUIRE_CHROMIUM") == "1"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
FIGURES = ("stage-bars", "sequence-strip", "graph-figure", "bound-ladder", "gantt")

if CHROMIUM is None and REQUIRED:
    pytest.fail("MTPP_REQUIRE_CHROMIUM=1 but chromium is not installed", pytrace=False)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install chromium)",
)


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium with a fresh profile, no network use of its own."""
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def screenshot(tmp_path: Path, page: Path) -> np.ndarray:
    """The page drawn in a 1200 x 900 window, as an RGB array."""
    png = tmp_path / f"{page.stem}.png"
    run = chromium(
        tmp_path / f"profile-{page.stem}",
        f"--screenshot={png}",
        "--window-size=1200,900",
        page.as_uri(),
    )
    assert png.is_file(), f"no screenshot; chromium said: {run.stderr[-2000:]}"
    with Image.open(png) as im:
        return np.asarray(im.convert("RGB"), dtype=float)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> tuple[dict, Path]:
    data, _, _, text = inference_case()
    page = tmp_path_factory.mktemp("browser") / "report.html"
    page.write_text(text, encoding="utf-8")
    return data, page


def test_chromium_builds_the_stage_table_and_every_figure(report_page, tmp_path):
    data, page = report_page
    run = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    dom = parse(run.stdout)
    assert len(dom.find("table", id="stage-table")) == 1
    rows = dom.find("tr", class_="stage")
    assert [int(r.attrs["data-stage"]) for r in rows] == [b["block"] for b in data["blocks"]]
    for ident in FIGURES:
        assert len(dom.find("svg", id=ident)) == 1, ident
    assert len(dom.find("rect", class_="seg")) == 6 * len(data["blocks"])


def test_the_screenshot_is_not_blank(report_page, tmp_path):
    _, page = report_page
    pixels = screenshot(tmp_path, page)
    assert pixels.shape == (900, 1200, 3)
    grey = pixels.mean(axis=2)
    assert grey.var() > 300  # a blank page is one colour (see the next test)
    colours = np.unique(pixels.reshape(-1, 3).astype(np.uint32) @ [65536, 256, 1])
    assert len(colours) > 50  # text, the header, the stages' colours
    header = pixels[:40].reshape(-1, 3).mean(axis=0)  # the dark header band
    assert header.max() < 100


def test_the_blank_check_can_fail(tmp_path):
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    assert screenshot(tmp_path, blank).mean(axis=2).var() < 1
