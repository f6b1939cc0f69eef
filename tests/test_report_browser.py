"""The report in a real browser: headless Chromium loads it offline, logs nothing, and draws every plot.

The page records each image's decoded and rendered size on ``<body>`` once it
has loaded (a few lines of inline script), so ``--dump-dom`` is enough to see
that the plots rendered; no DevTools session is needed. Name resolution is
switched off, so a page that needed the network would show missing images.
A full-page screenshot is kept in the test's tmp dir and copied to
``outputs/report-screenshot.png`` for people to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from specbench.report import write_report
from rows import XSS, grid_rows, make_row, write_results

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT_COPY = REPO / "outputs" / "report-screenshot.png"
MAX_HEIGHT = 16000  # px; taller screenshots hit Chromium's texture limits


def find_chromium() -> str | None:
    """Debian's chromium (what `make browser` installs), or one on PATH."""
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--hide-scrollbars", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
        # No name resolves: anything the page fetched from the network would fail to render.
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=60)


def page_messages(stderr: str, url: str) -> list[str]:
    """Console output and uncaught errors that came from the page itself."""
    return [
        line for line in stderr.splitlines()
        if "Uncaught" in line or "ERROR:CONSOLE" in line or ("CONSOLE" in line and url in line)
    ]


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        pytest.skip(
            "headless Chromium not found (/usr/bin/chromium or chromium on PATH); `make browser` installs it"
        )
    return binary


def test_report_renders_in_headless_chromium(chromium: str, tmp_path: Path) -> None:
    rows = grid_rows() + [
        make_row("ngram", 8, 1, "summarize", speedup=None, status="failed", error=f"engine died: {XSS}")
    ]
    report = write_report(write_results(tmp_path, rows))
    url = report.resolve().as_uri()

    dom = run_chromium(chromium, tmp_path / "profile", "--window-size=1280,2000", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f"<title>specbench report: {tmp_path.name}</title>" in dom.stdout
    assert "<script>alert" not in dom.stdout
    assert page_messages(dom.stderr, url) == []

    sizes = re.search(r'data-image-sizes="([^"]*)"', dom.stdout)
    assert sizes, "the page's load handler did not run"
    images = dict(entry.split(":", 1) for entry in sizes.group(1).split())
    assert sorted(images) == sorted(
        f"img-{s}" for s in ("speedup", "acceptance", "per-position", "heatmap", "tpot")
    )
    for image, measured in images.items():
        natural, rendered = measured.split(":")
        for size in (natural, rendered):
            width, height = (int(v) for v in size.split("x"))
            assert width > 100 and height > 100, f"{image} rendered at {measured}"

    height = int(re.search(r'data-page-height="(\d+)"', dom.stdout).group(1))
    screenshot = tmp_path / "report.png"
    shot = run_chromium(
        chromium, tmp_path / "profile", f"--window-size=1280,{min(height, MAX_HEIGHT)}",
        f"--screenshot={screenshot}", url,
    )
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert page_messages(shot.stderr, url) == []
    assert png_size(screenshot) == (1280, min(height, MAX_HEIGHT))
    SCREENSHOT_COPY.parent.mkdir(exist_ok=True)
    shutil.copyfile(screenshot, SCREENSHOT_COPY)
