"""One client's session turns must not change the reward another client's turns earn."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import httpx
from serve_helpers import TOKEN, FakeBackend, write_token_file

from kernelrl.candidate import Candidate
from kernelrl.result import EvalResult, Status

TASK_SOURCE = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
               "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n")


class SpeedBackend(FakeBackend):
    """Correct, at the speedup a candidate's `SPEED = x` line names."""

    def evaluate_batch(self, items: Sequence[tuple[object, Candidate | str]], *, size: object = None,
                       policy: object = None) -> list[EvalResult]:
        out = super().evaluate_batch(items, size=size, policy=policy)
        for i, (_, cand) in enumerate(items):
            source = cand.source if isinstance(cand, Candidate) else cand
            s = float(re.search(r"SPEED = (\S+)", source).group(1))
            out[i] = EvalResult(task=out[i].task, status=Status.CORRECT, speedup=s, speedup_ci=(s * 0.99, s * 1.01),
                                candidate_hash=out[i].candidate_hash)
        return out


def program(speed: float, tag: int) -> str:
    return (f"```python\n# {tag}\nSPEED = {speed}\nimport torch\nclass ModelNew(torch.nn.Module):\n"
            "    def forward(self, x):\n        return x + 1\n```\n")


def test_another_clients_turns_do_not_clip_this_clients_reward(start_server, tmp_path) -> None:
    other = "o" * 40
    tokens = write_token_file(tmp_path / "tokens.txt", f"trainer {TOKEN}\nother {other}")
    url = start_server(SpeedBackend(), token_file=tokens).url

    def session(token: str) -> str:
        r = httpx.post(f"{url}/v1/sessions", json={"task": TASK_SOURCE, "name": "plus_one", "turns": 16},
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
        return r.json()["session"]

    def turn(token: str, sid: str, answer: str) -> dict:
        r = httpx.post(f"{url}/v1/sessions/{sid}/turns", params={"wait": 10}, json={"answer": answer},
                       headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    theirs = session(other)
    for i in range(12):  # the other client's correct, unremarkable turns on the same task
        turn(other, theirs, program(1.0 + 0.001 * i, i))
    mine = turn(TOKEN, session(TOKEN), program(2.0, 99))
    assert mine["reward"] == math.log(2.0), mine["reward"]
