"""The site's pages as a person on a phone or a laptop sees them, in light and dark themes:
headless Chromium at 390 px and 1400 px wide, with the system's colour scheme emulated.

Measured from the pages' element boxes, not from pixels: no page is wider than the screen,
the playground's columns stack on a phone and its loss chart fits its column, the header keeps
one height (and, when wide, one row) whatever the status says, the colours follow the scheme on
every page, and the confusion matrix's labels do not overlap (figures.mjs notes the box of
every label it draws). Nothing here waits for Python: the pages' layout comes first.
"""
from __future__ import annotations

import re

import pytest

browser = pytest.mark.browser

PAGES = ("/", "/surprisal.html", "/chat.html")


def _luminance(css: str) -> float:
    r, g, b = (int(v) / 255 for v in re.findall(r"\d+", css)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# the header's height and its children's vertical centres with a short and a long status
_HEADER = """() => {
  const header = document.querySelector('header'), status = document.getElementById('status');
  const measure = () => ({
    height: header.getBoundingClientRect().height,
    mainTop: document.querySelector('main').getBoundingClientRect().top,
    centres: [...header.children].filter((e) => !e.hidden && e.offsetParent).map((e) => {
      const r = e.getBoundingClientRect(); return r.top + r.height / 2; }),
    overflow: document.documentElement.scrollWidth - innerWidth,
  });
  const old = status.textContent;
  status.textContent = 'Ready';
  const short = measure();
  status.textContent = 'Stopped at step 123: ' + 'a long message about the run '.repeat(12);
  const long = measure();
  status.textContent = old;
  return { short, long };
}"""

# a 10-class confusion matrix drawn as the digits demo draws it; the labels' boxes
_MATRIX = """async () => {
  const { drawFigure } = await import('./figures.mjs');
  const canvas = Object.assign(document.createElement('canvas'), { width: 560, height: 360 });
  const labels = [...'0123456789'];
  const rows = labels.map((_, i) => labels.map((_, j) => (i === j ? 95 : (i + j) % 7)));
  drawFigure(canvas, { kind: 'matrix', title: 'test set', rows, labels });
  return canvas.textBoxes;
}"""


def _overlap(a, b) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


@browser
def test_pages_fit_phones_follow_the_theme_and_keep_the_header_still(browser_session):
    base = browser_session.url.rstrip("/")
    for scheme in ("light", "dark"):
        page = browser_session.browser.new_page(color_scheme=scheme,
                                                viewport={"width": 390, "height": 844})
        try:
            for path in PAGES:
                page.set_viewport_size({"width": 390, "height": 844})
                page.goto(base + path)
                page.wait_for_selector("#site-nav a")
                colours = page.evaluate("""() => { const s = getComputedStyle(document.body);
                    return [s.backgroundColor, s.color]; }""")
                bg, fg = map(_luminance, colours)
                assert (bg < 0.2 and fg > 0.7) if scheme == "dark" else (bg > 0.9 and fg < 0.3), \
                    (path, scheme, colours)
                wide = page.evaluate("document.documentElement.scrollWidth")
                assert wide <= 390, f"{path} is {wide} px wide on a 390 px screen ({scheme})"
                if path != "/":
                    continue
                # the playground on a phone: the columns stack, the chart fits its column
                # (shown as a run's first loss shows it: the box stays hidden until then)
                page.wait_for_selector("#chart .uplot", state="attached", timeout=60_000)
                page.evaluate("document.getElementById('loss-box').hidden = false")
                page.wait_for_selector("#chart .uplot", timeout=10_000)
                page.wait_for_timeout(100)   # the chart follows its column on the next frame
                boxes = page.evaluate("""() => Object.fromEntries(['left', 'right', 'chart']
                    .map((id) => [id, document.getElementById(id).getBoundingClientRect().toJSON()])
                    .concat([['plot', document.querySelector('#chart .uplot').getBoundingClientRect().toJSON()]]))""")
                assert boxes["right"]["top"] >= boxes["left"]["bottom"] - 1, boxes
                assert boxes["plot"]["right"] <= boxes["right"]["right"] + 1 <= 391, boxes
                for width in (390, 1400):
                    page.set_viewport_size({"width": width, "height": 900})
                    h = page.evaluate(_HEADER)
                    assert h["long"]["height"] == h["short"]["height"], (width, h)
                    assert h["long"]["mainTop"] == h["short"]["mainTop"], (width, h)
                    assert h["long"]["overflow"] <= 0 and h["short"]["overflow"] <= 0, (width, h)
                    if width == 1400:  # one row: every item of the header on one line
                        centres = h["long"]["centres"]
                        assert max(centres) - min(centres) < 6, (width, h)
                # wide again: two columns side by side, and the chart grew with its column
                page.wait_for_timeout(100)
                boxes = page.evaluate("""() => ['left', 'right', 'chart'].map((id) =>
                    document.getElementById(id).getBoundingClientRect().toJSON())""")
                left, right, chart = boxes
                assert abs(left["top"] - right["top"]) < 2 and right["left"] > left["right"]
                plot = page.evaluate("document.querySelector('#chart .uplot').getBoundingClientRect().width")
                assert 0.9 * chart["width"] <= plot <= chart["width"] + 1
                if scheme == "light":
                    boxes = page.evaluate(_MATRIX)
                    assert any(b["text"] == "predicted →" for b in boxes)
                    assert sum(b["text"] == "3" for b in boxes) == 2   # a row and a column label
                    clashes = [(a["text"], b["text"]) for i, a in enumerate(boxes)
                               for b in boxes[i + 1:] if _overlap(a, b)]
                    assert clashes == [], clashes
                    assert all(0 <= b["x"] and b["x"] + b["w"] <= 560 and 0 <= b["y"]
                               and b["y"] + b["h"] <= 360 for b in boxes), boxes
        finally:
            page.close()
