"""Client tokens: who may call the reward server, read from a token file.

The server's token file names one client per line, `NAME TOKEN` (blank lines and lines that
start with `#` are skipped); a file holding a single bare token is one client named `default`.
A client's own token file holds its token alone (`TOKEN`) or its one line (`NAME TOKEN`).

Guarantees (`read_tokens` raises `TokenFileError`, with the reason, otherwise):
- the file is a regular file that neither group nor others may read or write (mode at most
  0600), since whoever reads it can submit code to the server in its clients' names;
- every token has at least `MIN_TOKEN_CHARS` characters, printable ASCII without spaces; names
  are 1-64 of `A-Z a-z 0-9 . _ @ -`; no name and no token appears twice;
- `match_token` compares the token presented with every client's token in constant time per
  comparison, and with all of them whatever matches, so the answer's timing does not say which
  token (or which prefix) came close.

Does not hash tokens at rest, rotate them while the server runs (edit the file and restart the
server: jobs stay with their client's name), or check who owns the file.
"""

from __future__ import annotations

import hmac
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MIN_TOKEN_CHARS = 32
DEFAULT_NAME = "default"  # the client of a file that holds a single bare token
ANONYMOUS = ""  # the owner of jobs sent to a server without tokens (loopback only)
_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
_TOKEN = re.compile(r"^[\x21-\x7e]+$")


class TokenFileError(ValueError):
    """A token file the server or a client refuses; the message says why and what to do."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientToken:
    name: str
    token: str

    def __repr__(self) -> str:  # never print a token
        return f"ClientToken(name={self.name!r})"


def _read(path: Path) -> list[str]:
    """The meaningful lines of a token file, after checking its type and mode."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"the token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise TokenFileError(f"the token file {path} may be read or written by others (mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}); make it private: chmod 600 {path}")
        text = path.read_text(encoding="ascii")
    except OSError as e:
        raise TokenFileError(f"cannot read the token file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TokenFileError(f"the token file {path} is not ASCII text") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _check_token(token: str, where: str) -> None:
    if not _TOKEN.match(token):
        raise TokenFileError(f"{where}: a token is printable ASCII without spaces")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileError(f"{where}: the token has {len(token)} characters; at least {MIN_TOKEN_CHARS} are "
                             "needed (make one with: head -c 32 /dev/urandom | base64)")


def read_tokens(path: str | Path) -> tuple[ClientToken, ...]:
    """Every client of a server's token file (see the module docstring)."""
    path = Path(path)
    lines = _read(path)
    if not lines:
        raise TokenFileError(f"the token file {path} holds no token")
    if len(lines) == 1 and len(lines[0].split()) == 1:
        _check_token(lines[0], str(path))
        return (ClientToken(name=DEFAULT_NAME, token=lines[0]),)
    clients: list[ClientToken] = []
    for number, line in enumerate(lines, 1):
        where = f"{path}, client {number}"
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(f"{where}: write one client per line as NAME TOKEN")
        name, token = parts
        if not _NAME.match(name):
            raise TokenFileError(f"{where}: the name {name[:70]!r} is not 1-64 of A-Z a-z 0-9 . _ @ -")
        _check_token(token, where)
        clients.append(ClientToken(name=name, token=token))
    for what, values in (("name", [c.name for c in clients]), ("token", [c.token for c in clients])):
        if len(set(values)) != len(values):
            raise TokenFileError(f"the token file {path} names a {what} twice")
    return tuple(clients)


def client_token(path: str | Path) -> str:
    """A client's token, from a file holding `TOKEN` or one `NAME TOKEN` line."""
    path = Path(path)
    lines = _read(path)
    if len(lines) != 1 or len(lines[0].split()) not in (1, 2):
        raise TokenFileError(f"the token file {path} must hold one token (TOKEN, or NAME TOKEN), for one client")
    token = lines[0].split()[-1]
    _check_token(token, str(path))
    return token


def match_token(clients: tuple[ClientToken, ...], presented: str) -> str | None:
    """The name of the client whose token was presented, or None."""
    given = presented.encode()
    found = None
    for client in clients:  # every comparison runs, whichever matches
        if hmac.compare_digest(given, client.token.encode()):
            found = client.name
    return found
