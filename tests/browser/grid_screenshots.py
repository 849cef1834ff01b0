"""The README's pictures of Deephaven's grid page on tickwire, made the way a user makes them.

    .venv/bin/python -m tests.browser.grid_screenshots [--out docs/img] [--port 0]

Starts tickwire in this process with the demo's ticking tables (as `tickwire demo` serves them),
opens the grid page it serves (`/iframe/widget/?name=...`) in headless Chromium and clicks through
the grid's own menus:

- grid-totals.png: `ticking_keyed` with the Aggregate Columns sidebar open and a Sum and a Max
  totals row on top of the ticking rows (Table Options > Aggregate Columns > Add Aggregation);
- grid-rollup.png: `ticking_append` rolled up by Sym with the Sum aggregation (Table Options >
  Rollup Rows, a double-click on Sym), one group expanded to its trades -- made only when tickwire
  serves rollups: the script first asks for one through the JS API and, when the server refuses,
  says so and writes no picture.

Each picture is written once the grid has drawn what it shows (its canvas text is recorded, as in
tests/test_browser.py), never on a fixed delay alone. Exit status 1 when a picture could not be made.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Optional, cast

from .cdp import Page, launch_chromium
from .jsapi import JsApiPage

ROOT = Path(__file__).resolve().parents[2]

CANVAS_HOOK = r"""
(() => {
  const g = window.__twGrid = {texts: [], calls: 0};
  const orig = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    g.calls += 1;
    // where on the page the text starts (the context's transform, then the canvas's box)
    const m = this.getTransform(), box = this.canvas.getBoundingClientRect();
    const sx = box.width ? this.canvas.width / box.width : 1, sy = box.height ? this.canvas.height / box.height : 1;
    g.texts.push([performance.now(), String(text), box.left + (m.a * x + m.c * y + m.e) / sx,
                  box.top + (m.b * x + m.d * y + m.f) / sy]);
    if (g.texts.length > 20000) g.texts.splice(0, g.texts.length - 20000);
    return orig.call(this, text, x, y, ...rest);
  };
})();
"""


def drawn(page: Page, seconds: float = 1.5) -> set[str]:
    """The strings the grid drew on its canvas in the last `seconds`."""
    return {text for text, _x, _y in drawn_at(page, seconds)}


def drawn_at(page: Page, seconds: float = 1.5, since: float = 0.0) -> list[tuple[str, float, float]]:
    """The strings the grid drew on its canvas in the last `seconds` (and after the page's clock read
    `since`, a `now(page)`), with where on the page each starts."""
    return [tuple(e) for e in page.evaluate(
        f"(() => {{ const now = performance.now(); return window.__twGrid.texts"
        f".filter(([t]) => now - t < {seconds * 1000} && t > {since}).map(([t, s, x, y]) => [s, x, y]); }})()")
        or []]


def now(page: Page) -> float:
    """The page's clock (the times `drawn_at` compares with)."""
    return float(page.evaluate("performance.now()"))


def wait(cond: Callable[[], object], timeout: float, what: str, page: Page) -> object:
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}{page.diagnostics()}")
        time.sleep(0.2)


def click(page: Page, selector_js: str, *, count: int = 1) -> None:
    """A real mouse click (or double-click) at the middle of the element `selector_js` returns, once
    the element has stopped moving (a sidebar page slides in: a click during the slide goes astray)."""
    where = (f"(() => {{ const e = {selector_js}; if (!e) return null;"
             f" e.scrollIntoView({{block: 'nearest'}}); const r = e.getBoundingClientRect();"
             f" return [r.left + r.width / 2, r.top + r.height / 2]; }})()")
    box, end = page.evaluate(where), time.monotonic() + 5
    while box is not None and time.monotonic() < end:
        time.sleep(0.1)
        again = page.evaluate(where)
        if again == box:
            break
        box = again
    if box is None:
        raise RuntimeError(f"nothing to click: {selector_js}{page.diagnostics()}")
    click_at(page, *box, count=count)


def click_at(page: Page, x: float, y: float, *, count: int = 1) -> None:
    """A real mouse click (or double-click) at page coordinates (x, y)."""
    page.cdp("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    for n in range(1, count + 1):
        for kind in ("mousePressed", "mouseReleased"):
            page.cdp("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": n})


def by_text(text: str, tags: str = "button, span, div, label") -> str:
    """JavaScript that finds the innermost element among `tags` whose text is `text`."""
    return (f"Array.from(document.querySelectorAll({tags!r})).filter(e => e.textContent.trim() === {text!r})"
            f".sort((a, b) => a.querySelectorAll('*').length - b.querySelectorAll('*').length)[0]")


def open_grid(page: Page, origin: str, name: str) -> None:
    page.cdp("Page.bringToFront")  # a tab in the background gets no animation frames: menus would not open
    page.add_init_script(CANVAS_HOOK)
    page.navigate(f"{origin}/iframe/widget/?name={name}")
    wait(lambda: page.evaluate("document.querySelector('canvas.grid-canvas') !== null && window.__twGrid.calls > 0"),
         60, "the grid to draw", page)
    wait(lambda: "Sym" in drawn(page), 30, "the grid's columns", page)


def table_options(page: Page, item: str) -> None:
    """Opens `item` of the Table Options menu (opening the menu unless it is showing)."""
    listed = f"!!({by_text(item)})"
    for _attempt in range(3):  # a click while the page is still settling may go unheard: click again
        if page.evaluate(listed):
            break
        click(page, "document.querySelector('button[aria-label=\"Table Options\"]')")
        end = time.monotonic() + 5
        while time.monotonic() < end and not page.evaluate(listed):
            time.sleep(0.2)
    wait(lambda: page.evaluate(listed), 1, f"the Table Options menu to list {item}", page)
    click(page, by_text(item))
    wait(lambda: page.evaluate("!!document.querySelector('.navigation-title')"), 10, f"the {item} page", page)


def shoot_totals(page: Page, origin: str, out: Path) -> None:
    open_grid(page, origin, "ticking_keyed")
    table_options(page, "Aggregate Columns")
    for operation in ("Sum", "Max"):
        page.evaluate(f"""(() => {{
            const select = document.querySelector('.aggregations select');
            Object.getOwnPropertyDescriptor(HTMLSelectElement.prototype, 'value').set.call(select, {operation!r});
            select.dispatchEvent(new Event('change', {{bubbles: true}}));
        }})()""")
        click(page, by_text("Add Aggregation", "button"))
        wait(lambda op=operation: op in drawn(page), 30, f"a {operation} totals row on the grid", page)
    click(page, by_text("Top", "label"))
    # the totals rows tick with the table: wait until they have been drawn again after the move
    wait(lambda: {"Sum", "Max"} <= drawn(page, 0.5), 30, "the totals rows drawn on top", page)
    time.sleep(0.5)  # the radio button's animation, for the picture only
    page.screenshot(out)


def rollups_served(browser, origin: str) -> Optional[str]:
    """None when tickwire answers a rollup from the JS API, else the rejection's message."""
    page = browser.new_page()
    try:
        js = JsApiPage(page, origin)
        js.login()
        js.open("ticking_append")
        out = js.settle("window.__tw.table.rollup({groupingColumns: ['Sym'], aggregations: {Sum: ['Size']}})"
                        ".then(t => { t.close(); return true; })", timeout_ms=30000)
        return None if out["state"] == "resolved" else f"{out['state']}: {out.get('message', '')}"
    finally:
        page.close()


def shoot_rollup(page: Page, origin: str, out: Path) -> None:
    open_grid(page, origin, "ticking_append")
    table_options(page, "Aggregate Columns")
    click(page, by_text("Add Aggregation", "button"))  # Sum, which the rollup's rows show
    wait(lambda: "Sum" in drawn(page), 30, "a Sum totals row", page)
    click(page, by_text("Back", "button"))
    table_options(page, "Rollup Rows")
    # a double-click on a column of Available Grouping Columns groups by it
    click(page, by_text("Sym", ".rollup-available-grouping-columns .title"), count=2)
    symbols = {f"SYM{i:02d}" for i in range(20)}

    def rollup_shown() -> Optional[float]:
        """The page's clock once the grid has laid the rollup out, else None."""
        if page.evaluate("document.body.innerText.includes('Rolling back')"):
            raise RuntimeError(f"the grid rolled the rollup back (the server refused it){page.diagnostics()}")
        grouped = page.evaluate("Array.from(document.querySelectorAll('.rollup-rows-group-by .title'))"
                                ".map(e => e.textContent.trim())")
        header = {text: x for text, x, _y in drawn_at(page, 0.5) if text in ("Sym", "Timestamp")}
        # the rollup puts its grouping column first (as its tree column)
        return now(page) if grouped == ["Sym"] and len(header) == 2 and header["Sym"] < header["Timestamp"] else None

    shown = cast(float, wait(rollup_shown, 30, "the grid to lay out rollup rows by Sym", page))

    def group_rows() -> list[tuple[str, float, float]]:
        """The symbols drawn in the tree column since the rollup was laid out, top first (the group
        rows; their Timestamp is the First of the group, as the grid asks for non-aggregated columns)."""
        texts = drawn_at(page, 1.0, since=shown)
        price = min((x for text, x, _y in texts if text == "Price"), default=0.0)
        rows = sorted({(text, x, y) for text, x, y in texts if text in symbols and x < price}, key=lambda r: r[2])
        return rows if len({text for text, _x, _y in rows}) >= 5 else []

    rows = cast(list[tuple[str, float, float]], wait(group_rows, 30, "the grid to draw rollup rows by Sym", page))
    # expand one group a few rows down (groups above it, its trades below): a click on its tree
    # marker, just left of its name
    symbol, x, y = rows[min(5, len(rows) - 1)]
    clicked = now(page)
    click_at(page, x - 10, y)

    def expanded() -> bool:
        # the group's constituent rows carry its symbol too: drawn on more rows than the group's own
        return len({round(y) for text, _x, y in drawn_at(page, 1.0, since=clicked) if text == symbol}) >= 3

    wait(expanded, 30, f"the {symbol} group to expand", page)
    time.sleep(0.5)
    page.screenshot(out)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"), help="folder of the PNGs (default docs/img)")
    ap.add_argument("--port", type=int, default=0, help="tickwire's port (default: any free one)")
    args = ap.parse_args(argv)
    out = Path(args.out)

    from tickwire.server.adapters.demo import DemoTicker
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=100)
    demo = DemoTicker(engine, seed=5)
    demo.tick()
    demo.start()
    server = TickwireServer(engine, port=args.port).start()
    origin = f"http://127.0.0.1:{getattr(server, 'web_port', None) or server.port}"
    failed = []
    try:
        with launch_chromium() as browser:
            page = browser.new_page()
            page.set_viewport(1100, 500)
            shoot_totals(page, origin, out / "grid-totals.png")
            print(f"wrote {out / 'grid-totals.png'}")
            page.close()
            why = rollups_served(browser, origin)
            if why is not None:
                failed.append(f"grid-rollup.png not made: tickwire refused the rollup ({why})")
            else:
                page = browser.new_page()
                page.set_viewport(1100, 500)
                try:
                    shoot_rollup(page, origin, out / "grid-rollup.png")
                    print(f"wrote {out / 'grid-rollup.png'}")
                except RuntimeError as exc:
                    failed.append(f"grid-rollup.png not made: {exc}")
                page.close()
    finally:
        demo.stop()
        server.stop()
        engine.stop()
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
