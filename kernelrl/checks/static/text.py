"""The candidate's text itself: characters that make code read differently from how it runs.

Rule: `bidi_control` (rejects) fires on every line holding a bidirectional control character
(U+202A-U+202E embeddings and overrides, U+2066-U+2069 isolates, U+200E/U+200F marks, U+061C):
"Trojan Source" (CVE-2021-42574). Python accepts them in comments and strings, C++ compilers in
comments and literals, and an editor or a review page then shows the code reordered: a `return`
that reads as commented out, a check that reads as part of a string. No kernel needs them. The
run pages show each as a visible `[U+XXXX]` (`kernelrl.web.code.visible`).

Does not catch: homoglyphs (a Cyrillic letter a in a name) and zero-width characters, which change
what a reader thinks a name is rather than the order code runs in; the other rules resolve names
as Python does, so a look-alike name is simply another name to them.
"""

from __future__ import annotations

from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo

BIDI_CONTROLS = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
_SHOWN = 5  # lines reported at most (each a finding); one is enough to reject


@register(R.BIDI_CONTROL)
def _bidi_control(src: SourceInfo) -> Iterator[Hit]:
    found = 0
    for number, line in enumerate(src.source.splitlines(), 1):
        codes = sorted({ord(c) for c in line if ord(c) in BIDI_CONTROLS})
        if codes:
            shown = ", ".join(f"U+{c:04X}" for c in codes)
            yield Hit(number, f"bidirectional control character(s) {shown}: the line reads differently from how "
                              "it runs (Trojan Source)")
            found += 1
            if found >= _SHOWN:
                return
