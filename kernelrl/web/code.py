"""Code and diffs on the run pages, at a bounded cost, and text with its hidden controls shown.

A candidate's source is the model's (up to the judge's 256 KiB, and chains of candidates can be
long); `difflib` is quadratic in lines at worst, so a page of a hundred 5,000-line candidates
took minutes. Here:

- `visible(text)`: bidirectional controls (Trojan Source: U+202A-U+202E, U+2066-U+2069, U+200E,
  U+200F, U+061C) and other invisible format characters are replaced by a visible `[U+XXXX]`, so
  code on a page reads as the compiler reads it; every text the pages escape goes through it;
- `code_html`: a source shown up to `MAX_CODE_CHARS`, the rest named, not sent;
- `diff_html`: no diff of a side over `MAX_DIFF_LINES` lines or `MAX_DIFF_CHARS` characters
  (the page says so, and the code is still shown); each diff is computed once and kept in a
  cache bounded in bytes (keyed by the two sources' digests), so a page reloaded every few
  seconds costs its first render once;
- `PageBudget`: a page's rendering stops computing diffs after `seconds`, or at once when the
  client has left (`cancel`), and says so on the page.

Does not bound the cost of a page's other parts (tables, evidence): they are linear in the
candidates shown, which `pages.task_page` caps.
"""

from __future__ import annotations

import difflib
import hashlib
import html
import threading
import time
from collections import OrderedDict

MAX_CODE_CHARS = 200_000
MAX_DIFF_LINES = 1500
MAX_DIFF_CHARS = 200_000
CACHE_BYTES = 32 << 20

# Bidirectional controls and other invisible format characters that make code read differently
# from how it runs: each shown as [U+XXXX].
HIDDEN = frozenset([0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2060, 0xFEFF, *range(0x202A, 0x202F),
                    *range(0x2066, 0x206A)])
_VISIBLE = {c: f"[U+{c:04X}]" for c in HIDDEN}


def visible(text: str) -> str:
    """`text` with every hidden control replaced by a visible `[U+XXXX]`."""
    return text.translate(_VISIBLE)


def esc(text: object) -> str:
    """HTML-escaped text (quotes too), hidden controls shown."""
    return html.escape(visible(str(text)), quote=True)


class PageBudget:
    """How long one page may spend on diffs, and whether its client is still there."""

    def __init__(self, seconds: float = 10.0) -> None:
        self.deadline = time.monotonic() + seconds
        self.cancel = threading.Event()  # set when the client left: stop at once

    def spent(self) -> bool:
        return self.cancel.is_set() or time.monotonic() > self.deadline


def code_html(source: str) -> str:
    shown = source[:MAX_CODE_CHARS]
    more = (f"\n... ({len(source) - MAX_CODE_CHARS} more characters not shown)" if len(source) > MAX_CODE_CHARS
            else "")
    return f"<pre class='code'>{esc(shown)}{esc(more)}</pre>"


class _DiffCache:
    """Rendered diffs by (before digest, after digest, names), least recently used out first,
    at most `max_bytes` of HTML in all."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str, str, str], str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str, str]) -> str | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, str, str, str], value: str) -> None:
        if len(value) > self.max_bytes // 4:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = value
            self._bytes += len(value)
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)


DIFFS = _DiffCache(CACHE_BYTES)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def diff_too_large(text: str) -> bool:
    return len(text) > MAX_DIFF_CHARS or text.count("\n") + 1 > MAX_DIFF_LINES


def diff_html(before: str, after: str, before_name: str, after_name: str, budget: PageBudget | None = None) -> str:
    """A unified diff as HTML; a note instead when a side is too large or the page's budget is spent."""
    for side in (before, after):
        if diff_too_large(side):
            return (f"<p class='empty'>not diffed here: a side has more than {MAX_DIFF_LINES} lines or "
                    f"{MAX_DIFF_CHARS} characters</p>")
    key = (_digest(before), _digest(after), before_name, after_name)
    found = DIFFS.get(key)
    if found is not None:
        return found
    if budget is not None and budget.spent():
        return "<p class='empty'>not diffed here: this page's time for diffs ran out (the candidate's own page has it)</p>"
    lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), before_name, after_name, lineterm=""))
    if not lines:
        out = "<p class='empty'>identical</p>"
    else:
        spans = []
        for line in lines:
            cls = ("hunk" if line.startswith("@@") else "file" if line.startswith(("+++", "---"))
                   else "add" if line.startswith("+") else "del" if line.startswith("-") else "ctx")
            spans.append(f"<span class='{cls}'>{esc(line)}</span>")
        out = "<pre class='diff'>" + "\n".join(spans) + "</pre>"
    DIFFS.put(key, out)
    return out
