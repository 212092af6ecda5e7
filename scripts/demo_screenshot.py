#!/usr/bin/env python
"""The demo page in a real browser: start `cdnpg demo`, type a sentence, click, wait for the paraphrases, the
coloured words and the figure, and save a screenshot. Debian's chromium (apt-get install chromium), driven by
playwright (pip install playwright; its own browser download is not needed).

    python scripts/demo_screenshot.py --model runs/template --out docs/demo.png

tests/test_demo.py drives the page with `use_page`, and starts the server with `serve`, as this script does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = ("chromium", "chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
SENTENCE = "how can i improve my english speaking skills in a short time ?"
START_SECONDS = 180  # model load and gradio's start on a busy 2-core machine
VIEWPORT = {"width": 1100, "height": 1500}


def chromium() -> str | None:
    """The system chromium's path, or None."""
    return next((path for name in CHROMIUM if (path := shutil.which(name))), None)


@contextmanager
def serve(model: str, port: int | None = None, extra: list[str] | None = None) -> Iterator[str]:
    """`cdnpg demo --model MODEL` of this Python in a process of its own, waited for (`cdnpg.demo.served`): yields
    its address, then stops it. A server that exits first is a RuntimeError with its stderr."""
    from cdnpg.demo import demo_command, free_port, served

    port = port or free_port()
    with served(demo_command(model, port, *(extra or [])), port, timeout=START_SECONDS) as (url, _):
        yield url


def use_page(url: str, sentence: str, screenshot: Path | str, timeout_s: float = 90) -> dict:
    """Open the page in headless chromium, type `sentence`, click Paraphrase, wait for the paraphrases, the coloured
    words and the figure, save a full-page screenshot; return what the page shows: `paraphrases` (the table's text),
    `words` (the coloured words' text and data-z), `figure` (whether the image is drawn)."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    if executable is None:
        raise RuntimeError("no chromium: apt-get install chromium")
    timeout = timeout_s * 1000
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url, timeout=timeout)
            page.locator("#input textarea").fill(sentence, timeout=timeout)
            page.locator("#paraphrase").click(timeout=timeout)
            page.locator("#words .cdnpg-word").first.wait_for(timeout=timeout)  # drawn after the paraphrases
            page.locator("#figure img").first.wait_for(timeout=timeout)
            page.wait_for_function(  # the figure's pixels are there
                "() => { const i = document.querySelector('#figure img'); return i && i.complete && i.naturalWidth > 0 }",
                timeout=timeout,
            )
            page.wait_for_timeout(300)  # transitions settle before the picture is taken
            words = page.locator("#words .cdnpg-word")
            shown = {
                "paraphrases": page.locator("#paraphrases").inner_text(),
                "words": [
                    (words.nth(i).inner_text(), float(words.nth(i).get_attribute("data-z")))
                    for i in range(words.count())
                ],
                "figure": page.locator("#figure img").first.evaluate("image => image.naturalWidth") > 0,
            }
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint folder or Hub id (e.g. runs/template)")
    parser.add_argument("--out", default="docs/demo.png", help="the screenshot (default docs/demo.png)")
    parser.add_argument("--sentence", default=SENTENCE)
    args = parser.parse_args(argv)
    if chromium() is None:
        parser.error("no chromium on PATH: apt-get install chromium")
    began = time.perf_counter()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with serve(args.model) as url:
        shown = use_page(url, args.sentence, args.out)
    from PIL import Image

    with Image.open(args.out) as image:  # 256 colours: a page of flat colours keeps its look at a third of the size
        image.convert("RGB").quantize(256).save(args.out, optimize=True)
    print(f"{args.out}: {len(shown['words'])} coloured words, figure drawn: {shown['figure']} "
          f"({time.perf_counter() - began:.0f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
