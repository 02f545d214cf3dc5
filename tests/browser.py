"""Debian's chromium, headless: a page rendered to PNG and to DOM, and the requests the page made (net log)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
HEADLESS_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
WINDOW = "1200,900"
TIMEOUT_S = 90
# Requests the browser makes for itself (time sync, accounts) carry no initiator; a page's carry its origin
# (`null` for a file:// page).
BROWSER_OWN_INITIATOR = "not an origin"


def chromium(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run([CHROMIUM, *HEADLESS_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW}",
                               *flags, url], capture_output=True, text=True, timeout=TIMEOUT_S, check=True)


def screenshot(page: Path, png: Path) -> Path:
    chromium(page.resolve().as_uri(), f"--screenshot={png}")
    return png


def dump_dom(page: Path) -> str:
    """The DOM after the page loaded, serialised by the browser."""
    return chromium(page.resolve().as_uri(), "--dump-dom").stdout


def page_requests(url: str, net_log: Path) -> list[str]:
    """URLs the page requested over the network while loading (from chromium's --log-net-log)."""
    chromium(url, f"--log-net-log={net_log}", "--dump-dom")
    log = json.loads(net_log.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    starts = [e.get("params", {}) for e in log["events"] if e["type"] == start_job]
    return sorted({p["url"] for p in starts if "url" in p and p.get("initiator") != BROWSER_OWN_INITIATOR})


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parents: list[Element]
    text: str = ""

    def inside(self, other: Element) -> bool:
        return any(p is other for p in self.parents)


class _Tree(HTMLParser):
    """Elements (tag, attributes, text inside) in document order; enough to inspect a dumped DOM."""

    VOID = {"img", "meta", "br", "hr", "input", "link", "circle", "line", "rect", "path"}

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self.open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs}, list(self.open))
        self.elements.append(el)
        if tag not in self.VOID:
            self.open.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {k: v or "" for k, v in attrs}, list(self.open)))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.open) - 1, -1, -1):
            if self.open[i].tag == tag:
                del self.open[i:]
                break

    def handle_data(self, data: str) -> None:
        for el in self.open:
            el.text += data


def parse(dom: str) -> list[Element]:
    tree = _Tree()
    tree.feed(dom)
    return tree.elements


def has_class(el: Element, name: str) -> bool:
    return name in el.attrs.get("class", "").split()
