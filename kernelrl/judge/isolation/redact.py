"""What a worker says, with the judge's machine taken out: verdicts reveal nothing of the host.

A program under test can put anything in its error messages and its log (a compile error that
quotes `#include "/etc/passwd"`, an exception carrying /proc/self/mountinfo, /sys/class/net or
its environment), and every verdict is shown to the policy that wrote it. `redact` is applied by
the sandbox to everything of a worker's that reaches a result (an error's message and
traceback, the log tail, a death's reason):

- lines shaped like a system account file's (/etc/passwd, /etc/group, /etc/shadow) or a mount
  table's (/proc/mounts, /proc/self/mountinfo) are replaced whole;
- the judge's own folders (its home, working folder, the checkout or installation holding
  kernelrl, the Python environment, temporary folder) become `<home>`, `<cwd>`, `<kernelrl>`,
  `<python>`, `<tmp>`;
- the value of every variable of the judge's environment of 8 characters or more (PATH among
  them), each folder of its PATH outside the system's own, the machine's name, its network
  interfaces' names (but `lo`), MAC addresses and IPv4 addresses other than loopback become
  placeholders.

Does not guarantee: that a program cannot encode a fact so these patterns miss it (spelled
backwards, in its output's values); only that the facts a verdict carries verbatim are gone.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sys
import sysconfig
import tempfile
from pathlib import Path

_ACCOUNT_LINE = re.compile(r"^[A-Za-z0-9._-]+:[^:\n]*:\d*:\d*:[^\n]*$", re.MULTILINE)
_MOUNT_LINE = re.compile(r"^\S+ /\S* \S+ \S+ \d+ \d+$", re.MULTILINE)
_MOUNTINFO_LINE = re.compile(r"^\d+ \d+ \d+:\d+ /\S* /\S* [^\n]*$", re.MULTILINE)
_MAC = re.compile(r"\b[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}\b")
_IPV4 = re.compile(r"\b(?!127\.)(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3}\b")
_SYSTEM_BIN = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])


@functools.cache
def _replacements() -> tuple[tuple[str, str], ...]:
    """(host fact, placeholder), longest first, so a path is replaced before a folder inside it."""
    pairs: dict[str, str] = {}
    for value, name in ((os.path.expanduser("~"), "<home>"), (os.getcwd(), "<cwd>"), (_PACKAGE_PARENT, "<kernelrl>"),
                        (sys.prefix, "<python>"), (sys.base_prefix, "<python>"),
                        (sysconfig.get_paths().get("purelib", ""), "<site-packages>"),
                        (tempfile.gettempdir(), "<tmp>")):
        if len(value) > 1 and value not in ("/usr", "/tmp"):  # system folders say nothing of this host
            pairs[value] = name
            pairs[os.path.realpath(value)] = name
    for key, value in os.environ.items():
        if len(value) >= 8 and not value.isdigit():
            pairs.setdefault(value, f"<{key}>")
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and folder not in _SYSTEM_BIN and len(folder) > 1:
            pairs.setdefault(folder, "<PATH folder>")
    host = socket.gethostname()
    if len(host) >= 3:
        pairs[host] = "<host>"
    return tuple(sorted(pairs.items(), key=lambda kv: -len(kv[0])))


@functools.cache
def _interfaces() -> re.Pattern[str] | None:
    try:
        names = [n for n in os.listdir("/sys/class/net") if n != "lo" and len(n) >= 2]
    except OSError:
        return None
    if not names:
        return None
    return re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
                      + r")(?![A-Za-z0-9_])")


def redact(text: str) -> str:
    """`text` with the judge's machine taken out (see the module docstring)."""
    if not text:
        return text
    text = _ACCOUNT_LINE.sub("<a line of a system account file>", text)
    text = _MOUNT_LINE.sub("<a line of a mount table>", text)
    text = _MOUNTINFO_LINE.sub("<a line of a mount table>", text)
    for fact, placeholder in _replacements():
        text = text.replace(fact, placeholder)
    interfaces = _interfaces()
    if interfaces is not None:
        text = interfaces.sub("<interface>", text)
    text = _MAC.sub("<mac>", text)
    return _IPV4.sub("<ip>", text)
