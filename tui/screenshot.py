"""``python -m tui.screenshot``: the console against a live server, saved as an SVG.

How README's picture is made: start a server with real traffic (``servedeck serve
--demo-load 2 --expose-text``), then run this with the server's URL and admin token. It opens
the console headless at a fixed size, lets the polls fill the sparklines for ``--wait``
seconds, presses the given keys (``--keys down,enter`` opens the selected request's detail
view), waits ``--settle`` seconds more and saves Textual's own SVG screenshot. Turning the SVG
into a PNG is a separate step with any SVG renderer (docs/operations.md, "The console's
pictures", names the one used), so the console gains no image dependency.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from tui.app import ConsoleApp
from tui.config import ConsoleSettings

SIZE = (150, 46)
"""Columns and rows: wide enough for every main-screen panel at once."""


async def capture(
    settings: ConsoleSettings, out: Path, wait_s: float, keys: list[str], settle_s: float
) -> Path:
    app = ConsoleApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(wait_s)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(settle_s)
        saved = app.save_screenshot(filename=out.name, path=str(out.parent))
    return Path(saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tui.screenshot", description=__doc__)
    parser.add_argument("--url", default=ConsoleSettings().url)
    parser.add_argument("--token", required=True, help="the server's admin token")
    parser.add_argument("--out", type=Path, default=Path("docs/console.svg"))
    parser.add_argument("--wait", type=float, default=20.0, help="seconds before the keys")
    parser.add_argument("--keys", default="", help="comma-separated keys to press, in order")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the keys")
    args = parser.parse_args(argv)
    settings = ConsoleSettings(url=args.url, token=args.token)
    keys = [key for key in args.keys.split(",") if key]
    saved = asyncio.run(capture(settings, args.out, args.wait, keys, args.settle))
    print(saved)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
