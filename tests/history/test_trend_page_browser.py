"""The trend page in a browser: headless Chromium (Debian's `chromium` package) loads the page
of a history with a planted 10 % slowdown, from its folder (file://, no server); the DOM after
load says every figure decoded and the tables are there, and the screenshot shows the red
regression banner. The screenshot is kept: results/ci/history-browser/ (git-ignored).

Where Chromium is absent the test is skipped, naming it; CI installs it and sets
DSV4BENCH_REQUIRE_CHROMIUM=1, and there a missing browser fails the test instead.
DSV4BENCH_TREND_PAGE=DIR checks that folder's page too (CI: the smoke run's page), and with
DSV4BENCH_TREND_PAGE_FLAGS=1 that it shows a regression (CI: its planted slowdown's page).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from tests.history.conftest import ROOT

ARTIFACTS = ROOT / "results" / "ci" / "history-browser"
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
# appended to a copy of the page: after load, what the browser rendered goes into the DOM
PROBE = """<script>window.addEventListener("load", () => {
  const imgs = [...document.images];
  const gate = document.getElementById("gate");
  document.body.dataset.images = imgs.length;
  document.body.dataset.decoded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.tables = document.querySelectorAll("table").length;
  document.body.dataset.gateColor = getComputedStyle(gate).backgroundColor;
  document.body.dataset.flagged = document.querySelectorAll("tr.regression").length;
});</script>"""
RED = (0xD6, 0x27, 0x28)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("DSV4BENCH_REQUIRE_CHROMIUM"):
        pytest.fail("DSV4BENCH_REQUIRE_CHROMIUM is set but no chromium is on PATH")
    pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")


def browse(page: Path, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def rendered(folder: Path) -> dict[str, str]:
    """The probe's findings on the page of `folder` (a copy beside it, so images resolve)."""
    probe = folder / "probe.html"
    probe.write_text((folder / "index.html").read_text().replace("</body>", PROBE + "</body>"))
    try:
        p = browse(probe, "--virtual-time-budget=10000", "--dump-dom")
    finally:
        probe.unlink()
    assert p.returncode == 0, p.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", p.stdout)
    assert body, p.stdout[:500]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))


def screenshot(folder: Path, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    p = browse(folder / "index.html", "--window-size=1300,1400", f"--screenshot={shot}")
    assert p.returncode == 0 and shot.is_file(), p.stderr[-2000:]
    print(f"screenshot: {shot}")
    return shot


def red_pixels(shot: Path) -> int:
    colors = Image.open(shot).convert("RGB").getcolors(1 << 24) or []
    near = lambda c: all(abs(a - b) <= 6 for a, b in zip(c, RED, strict=True))
    return sum(n for n, c in colors if near(c))


def test_the_page_renders_and_flags_the_planted_slowdown(planted):
    _, page = planted
    found = rendered(page)
    assert int(found["images"]) > 0 and found["decoded"] == found["images"], found
    assert int(found["tables"]) >= 3, found
    assert found["gate-color"] == "rgb(214, 39, 40)", found
    assert int(found["flagged"]) > 0, found
    shot = screenshot(page, "planted-slowdown")
    assert red_pixels(shot) > 5000  # the banner: 1266 x ~40 px of #d62728


def test_a_given_trend_page_renders():
    folder = os.environ.get("DSV4BENCH_TREND_PAGE")
    if not folder:
        pytest.skip("DSV4BENCH_TREND_PAGE is not set (CI sets it to the smoke run's trend page)")
    page = Path(folder).resolve()
    found = rendered(page)
    assert int(found["images"]) > 0 and found["decoded"] == found["images"], found
    assert int(found["tables"]) >= 2, found
    if os.environ.get("DSV4BENCH_TREND_PAGE_FLAGS"):  # CI's planted slowdown: shown in red
        assert found["gate-color"] == "rgb(214, 39, 40)", found
        assert int(found["flagged"]) > 0, found
        assert red_pixels(screenshot(page, page.name)) > 5000
    screenshot(Path(folder).resolve(), "ci-trend")
