"""The report renders: PNG figures, a Markdown summary, and a self-contained HTML page that a real headless
Chromium opens and shows (table and figures on a screenshot)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from klear.evaluate.report import render_markdown

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
MPL_BLUE, MPL_ORANGE = (31, 119, 180), (255, 127, 14)  # matplotlib's first two colours: the sft and rl bars


def test_figures_are_real_pngs(planted: dict[str, Any]) -> None:
    for name in ("scores.png", "pass_counts.png", "lengths-sft.png", "lengths-rl.png"):
        path = planted["out"] / name
        assert path.stat().st_size > 5000, name
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 400
            assert len(image.convert("RGB").getcolors(maxcolors=1 << 24) or []) > 20, f"{name} is (nearly) blank"


def test_html_is_self_contained(planted: dict[str, Any]) -> None:
    page = (planted["out"] / "report.html").read_text()
    sources = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert len(sources) == 4 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"(src|href)=\"(https?:|file:|//)", page) and "<script" not in page and "<link" not in page
    assert "<td>Toy</td>" in page and "40.6 ± 22.5" in page and "sampling.temperature" in page


def test_markdown_for_the_kfp_ui_has_no_broken_images(planted: dict[str, Any]) -> None:
    summary = render_markdown(planted["report"], with_figures=False)
    assert "![" not in summary and "| Toy | 8 | 4 | 40.6 ± 22.5 | 100.0 ± 0.0 |" in summary
    assert "![scores](scores.png)" in (planted["out"] / "report.md").read_text()


def _colour_pixels(image: Image.Image, colour: tuple[int, int, int], tolerance: int = 12) -> int:
    return sum(count for count, pixel in image.getcolors(maxcolors=1 << 24) or []
               if all(abs(a - b) <= tolerance for a, b in zip(pixel, colour)))


def test_headless_chromium_shows_the_table_and_figures(planted: dict[str, Any], tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Debian's chromium is not installed here and could not be (.ci/run installs it with apt-get)")
    shot = tmp_path / "shot.png"
    page = (planted["out"] / "report.html").resolve()
    result = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                             f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert shot.exists(), result.stderr[-2000:]
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
    assert rgb.size == (1280, 2000)
    colours = rgb.getcolors(maxcolors=1 << 24) or []
    assert len(colours) > 200, "the screenshot is (nearly) blank"
    dark = sum(count for count, pixel in colours if max(pixel) < 80)
    assert dark > 2000, "no text on the page"  # headings and table cells
    # The score chart's bars can only be there if the inlined PNG was decoded and drawn.
    assert _colour_pixels(rgb, MPL_BLUE) > 3000 and _colour_pixels(rgb, MPL_ORANGE) > 3000
    # The table's header row background (#f0f2f5) shows the table itself was laid out.
    assert _colour_pixels(rgb, (240, 242, 245), tolerance=2) > 1000
