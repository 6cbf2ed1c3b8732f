"""Tokens: a private token file of long tokens, one per client, and jobs that only their client sees."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from serve_helpers import TOKEN, FakeBackend, fast_client, write_token_file

from kernelrl.backends.api import ItemIn, wire_item
from kernelrl.backends.client import RewardClient, ServeError
from kernelrl.serve.config import ServeConfig
from kernelrl.serve.server import RewardServer, StartError
from kernelrl.tasks.task import Task
from kernelrl.web.tokens import MIN_TOKEN_CHARS, TokenFileError, client_token, match_token, read_tokens

ALICE = "a" * 20 + "-alice-token-0123456789"
BOB = "b" * 20 + "-bob-token-0123456789xx"
TASK = Task(name="plus_one", source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                                    "        return x + 1\ndef get_inputs():\n    return [torch.randn(4)]\n"
                                    "def get_init_inputs():\n    return []\n")


def test_one_token_per_client(tmp_path: Path) -> None:
    path = write_token_file(tmp_path / "tokens", f"# trainers\nalice {ALICE}\n\nbob   {BOB}\n")
    clients = read_tokens(path)
    assert [c.name for c in clients] == ["alice", "bob"]
    assert match_token(clients, BOB) == "bob" and match_token(clients, ALICE) == "alice"
    assert match_token(clients, ALICE[:-1]) is None and match_token(clients, "") is None
    assert ALICE not in repr(clients)
    single = read_tokens(write_token_file(tmp_path / "one", TOKEN))
    assert [(c.name, c.token) for c in single] == [("default", TOKEN)]
    # A client's own file: its token alone, or its NAME TOKEN line.
    assert client_token(write_token_file(tmp_path / "mine", f"bob {BOB}")) == BOB
    with pytest.raises(TokenFileError, match="for one client"):
        client_token(path)


@pytest.mark.parametrize(("text", "mode", "reason"), [
    (TOKEN, 0o644, "may be read or written by others \\(mode 0644\\); make it private: chmod 600"),
    (TOKEN, 0o640, "mode 0640"),
    (TOKEN, 0o602, "mode 0602"),
    ("short-token", 0o600, f"the token has 11 characters; at least {MIN_TOKEN_CHARS} are needed"),
    (f"alice {'x' * 31}", 0o600, "the token has 31 characters"),
    ("", 0o600, "holds no token"),
    (f"alice {ALICE}\nalice {BOB}", 0o600, "names a name twice"),
    (f"alice {ALICE}\nbob {ALICE}", 0o600, "names a token twice"),
    (f"alice {ALICE} extra", 0o600, "one client per line as NAME TOKEN"),
    (f"al/ice {ALICE}", 0o600, "is not 1-64 of"),
])
def test_bad_token_files_are_refused(tmp_path: Path, text: str, mode: int, reason: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(TokenFileError, match=reason):
        read_tokens(path)
    # and the server does not start, with that reason
    with pytest.raises(StartError, match=reason):
        RewardServer(ServeConfig(port=0, db_path=tmp_path / "s.db", token_file=path), backend=FakeBackend())


def test_a_folder_is_not_a_token_file(tmp_path: Path) -> None:
    folder = tmp_path / "tokens"
    folder.mkdir(mode=0o700)
    with pytest.raises(TokenFileError, match="not a regular file"):
        read_tokens(folder)


def test_jobs_are_visible_only_to_their_client(start_server, tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path / "tokens", f"alice {ALICE}\nbob {BOB}")
    backend = FakeBackend()
    url = start_server(backend, token_file=tokens).url
    alice, bob = fast_client(url, token=ALICE), fast_client(url, token=BOB)
    job = alice.submit([alice_item := _item("alice's candidate", key="k1")]).job
    assert alice.wait(job)[0].candidate_hash
    with pytest.raises(ServeError) as e:
        bob.job(job)
    assert e.value.status == 404  # as if it did not exist
    r = httpx.get(f"{url}/v1/jobs/{job}", headers={"Authorization": f"Bearer {BOB}"})
    assert r.status_code == 404 and r.json() == {"error": f"no job {job!r}"}
    # Keys are per client: bob's key k1 is his own, neither alice's result nor a conflict.
    other = bob.submit([_item("bob's candidate", key="k1")])
    assert other.reused == 0
    (bobs,) = bob.wait(other.job)
    assert bobs.candidate_hash != alice.wait(job)[0].candidate_hash
    again = alice.submit([alice_item])
    assert again.reused == 1  # alice's own retry is still answered from her key
    assert len(backend.evaluated) == 2


def test_a_client_reads_its_token_file(start_server, tmp_path: Path) -> None:
    tokens = write_token_file(tmp_path / "tokens", f"alice {ALICE}\nbob {BOB}")
    url = start_server(FakeBackend(), token_file=tokens).url
    mine = write_token_file(tmp_path / "bob.token", f"bob {BOB}")
    with RewardClient(url, token_file=mine) as client:
        assert client.info().max_items_per_job == 1024
    loose = tmp_path / "loose.token"
    loose.write_text(BOB)
    loose.chmod(0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        RewardClient(url, token_file=loose)


def _item(candidate: str, key: str | None = None) -> ItemIn:
    return wire_item(TASK, candidate, key)
