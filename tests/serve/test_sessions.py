"""Refinement sessions over HTTP on 127.0.0.1, with a scripted evaluator backend: create, prompt,
turns with their verdict text and reward, the history, close; tokens, limits and the guard."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import COMPILER_LINE, TOKEN, ScriptedBackend, fast_client, write_token_file

from kernelrl.backends.client import ServeError
from kernelrl.episodes.episode import discounted_returns
from kernelrl.result import EvalResult, Status
from kernelrl.reward import RewardModel
from kernelrl.tasks.task import Task

TASK_SOURCE = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1
def get_inputs():
    return [torch.randn(4)]
def get_init_inputs():
    return []
"""
TASK = Task(name="plus_one", source=TASK_SOURCE)
GOOD = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
BROKEN = GOOD.replace("x + 1", "x.plus_one()  # BUILD_FAILS")
WRONG = GOOD.replace("x + 1", "x + 2  # WRONG")


def answer(code: str, analysis: str = "Analysis: fuse it.") -> str:
    return f"{analysis}\n\n```python\n{code}```\n"


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create(url: str, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/sessions", json={"task": TASK_SOURCE, "name": "plus_one", **body},
                      headers=headers if headers is not None else auth())


def prompt(url: str, session: str, wait: float = 10) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/sessions/{session}/prompt", params={"wait": wait}, headers=auth(), timeout=30).json()


def submit(url: str, session: str, wait: float = 10, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/sessions/{session}/turns", params={"wait": wait}, json=body, headers=auth(),
                      timeout=30)


def test_a_session_over_http_create_submit_read_the_verdict_submit_again_close(start_server, token_file) -> None:
    backend = ScriptedBackend()
    url = start_server(backend, token_file=token_file).url
    r = create(url, turns=3, gamma=0.5)
    assert r.status_code == 201, r.text
    session = r.json()["session"]
    assert r.headers["location"] == f"/v1/sessions/{session}"
    assert r.json()["next_turn"] == 1 and not r.json()["done"] and r.json()["history"] == []

    first = prompt(url, session)
    assert first["state"] == "ready" and first["turn"] == 1 and first["profile_error"] is None
    assert TASK_SOURCE.strip() in first["prompt"] and "float32[4]" in first["prompt"]  # the profile's shapes

    r = submit(url, session, answer=answer(BROKEN), turn=1)
    assert r.status_code == 200, r.text
    one = r.json()
    assert one["state"] == "judged" and one["status"] == "compile_error" and not one["done"]
    assert COMPILER_LINE in one["verdict"] and "c++ -c" not in one["verdict"]
    assert one["reward"] == pytest.approx(RewardModel().score(backend_result(Status.COMPILE_ERROR)).value)
    # the next prompt (in the reply, and from the prompt route) holds turn 1's code and compiler error
    assert one["prompt"] == prompt(url, session)["prompt"]
    assert COMPILER_LINE in one["prompt"] and "x.plus_one()" in one["prompt"] and "Turn 2 of 3" in one["prompt"]

    r = submit(url, session, answer=answer(GOOD))  # the turn number is optional
    two = r.json()
    assert r.status_code == 200 and two["turn"] == 2 and two["status"] == "correct" and two["speedup"] > 1.0
    assert two["verdict"].startswith("Correct. Speedup against eager PyTorch:")
    assert two["reward"] > one["reward"] and not two["done"]

    view = httpx.get(f"{url}/v1/sessions/{session}", headers=auth()).json()
    assert [t["turn"] for t in view["history"]] == [1, 2] and view["next_turn"] == 3
    assert view["rewards"] == [one["reward"], two["reward"]]
    assert view["returns"] == pytest.approx(discounted_returns(view["rewards"], 0.5))
    assert view["returns"][0] == pytest.approx(one["reward"] + 0.5 * two["reward"])
    # the job that judged turn 2 is the client's, with the full result
    job = httpx.get(f"{url}/v1/jobs/{two['job']}", headers=auth()).json()
    assert job["results"][0]["status"] == "correct"

    closed = httpx.delete(f"{url}/v1/sessions/{session}", headers=auth()).json()
    assert closed["closed"] and closed["next_turn"] is None and len(closed["history"]) == 2
    r = submit(url, session, answer=answer(GOOD, "again"), turn=3)
    assert r.status_code == 409 and "closed" in r.json()["error"]
    assert prompt(url, session)["state"] == "closed"


def backend_result(status: Status) -> EvalResult:
    return EvalResult(task="plus_one", status=status)


def test_every_session_route_needs_the_token_and_another_clients_session_is_404(start_server, tmp_path) -> None:
    other = "o" * 40
    tokens = write_token_file(tmp_path / "tokens.txt", f"trainer {TOKEN}\nother {other}")
    url = start_server(ScriptedBackend(), token_file=tokens).url
    session = create(url).json()["session"]
    routes = [("POST", "/v1/sessions"), ("GET", f"/v1/sessions/{session}"), ("DELETE", f"/v1/sessions/{session}"),
              ("GET", f"/v1/sessions/{session}/prompt"), ("POST", f"/v1/sessions/{session}/turns"),
              ("GET", f"/v1/sessions/{session}/turns/1")]
    for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        for method, path in routes:
            r = httpx.request(method, url + path, headers=bad, json={"task": "x"} if method == "POST" else None)
            assert r.status_code == 401, (method, path, bad)
    # another client sees nothing of it: every route is a 404, and nothing changed
    for method, path in routes[1:]:
        r = httpx.request(method, url + path, headers=auth(other),
                          json={"candidate": GOOD, "turn": 1} if method == "POST" else None)
        assert r.status_code == 404, (method, path, r.text)
    view = httpx.get(f"{url}/v1/sessions/{session}", headers=auth()).json()
    assert not view["closed"] and view["history"] == []


def test_the_guard_holds_on_session_routes(start_server) -> None:
    url = start_server(ScriptedBackend()).url
    session = create(url).json()["session"]
    r = httpx.post(f"{url}/v1/sessions/{session}/turns", content=b'{"candidate": "x"}',
                   headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = httpx.delete(f"{url}/v1/sessions/{session}", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    r = httpx.get(f"{url}/v1/sessions/{session}", headers={"Host": "evil.example"})
    assert r.status_code == 403
    assert not httpx.get(f"{url}/v1/sessions/{session}").json()["closed"]


def test_an_answer_without_code_is_a_turn_judged_at_once(start_server) -> None:
    backend = ScriptedBackend()
    url = start_server(backend).url
    session = create(url, turns=2).json()["session"]
    r = submit(url, session, answer="I would fuse the ops, but here is no code.", turn=1)
    one = r.json()
    assert r.status_code == 200 and one["status"] == "no_code" and one["job"] is None
    assert "no complete fenced code block" in one["verdict"]
    assert one["reward"] == pytest.approx(RewardModel().config.penalties.no_code)
    assert backend.evaluated == []
    assert "no complete code block" in one["prompt"] or "no complete fenced code block" in one["prompt"]


def test_turns_are_taken_in_order_once_each(start_server) -> None:
    backend = ScriptedBackend()
    url = start_server(backend).url
    session = create(url, turns=2).json()["session"]
    r = submit(url, session, candidate=GOOD, turn=2)
    assert r.status_code == 409 and "next turn is 1" in r.json()["error"]
    first = submit(url, session, candidate=WRONG, turn=1).json()
    assert first["status"] == "incorrect" and "Fix the computation" in first["verdict"]
    again = submit(url, session, candidate=WRONG, turn=1)  # a retry returns the stored turn, judged once
    assert again.status_code == 200 and again.json() == first and len(backend.evaluated) == 1
    r = submit(url, session, candidate=GOOD, turn=1)
    assert r.status_code == 409 and "another answer" in r.json()["error"]
    last = submit(url, session, candidate=GOOD, turn=2).json()
    assert last["done"] and last["prompt"] is None
    r = submit(url, session, candidate=GOOD + "# more\n", turn=3)
    assert r.status_code in (409, 400)
    assert prompt(url, session)["state"] == "done"
    view = httpx.get(f"{url}/v1/sessions/{session}", headers=auth()).json()
    assert view["done"] and view["next_turn"] is None and len(backend.evaluated) == 2


def test_a_turn_waits_in_the_queue_and_the_next_waits_for_its_verdict(start_server) -> None:
    gate = threading.Event()
    url = start_server(ScriptedBackend(gate=gate)).url
    session = create(url, turns=2).json()["session"]
    assert prompt(url, session, wait=0)["state"] in ("waiting", "ready")  # the profile is not gated
    r = submit(url, session, candidate=WRONG, turn=1, wait=0)
    assert r.status_code == 202 and r.json()["state"] == "pending" and r.json()["job"]
    assert r.headers["location"] == f"/v1/sessions/{session}/turns/1"
    assert prompt(url, session, wait=0)["state"] == "waiting"  # turn 2's prompt needs turn 1's verdict
    r = submit(url, session, candidate=GOOD, turn=2, wait=0)
    assert r.status_code == 409 and "still being judged" in r.json()["error"]
    gate.set()
    turn = httpx.get(f"{url}/v1/sessions/{session}/turns/1", params={"wait": 10}, headers=auth(), timeout=30).json()
    assert turn["state"] == "judged" and turn["status"] == "incorrect"
    assert prompt(url, session, wait=0)["state"] == "ready"


def test_the_same_turn_sent_at_once_by_eight_threads_is_judged_once(start_server) -> None:
    backend = ScriptedBackend(delay_s=0.2)
    url = start_server(backend).url
    session = create(url, turns=2).json()["session"]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: submit(url, session, candidate=GOOD, turn=1, wait=10), range(8)))
    assert {r.status_code for r in replies} == {200}
    assert len({r.json()["job"] for r in replies}) == 1 and len(backend.evaluated) == 1


def test_a_full_queue_refuses_the_turn_without_taking_it(start_server) -> None:
    gate = threading.Event()
    url = start_server(ScriptedBackend(gate=gate), max_pending_items=1).url
    session = create(url, turns=2).json()["session"]
    prompt(url, session)  # the profile job has ended: the queue is empty
    blocker = httpx.post(f"{url}/v1/evaluate", headers=auth(),
                         json={"items": [{"task": TASK_SOURCE, "candidate": "import torch  # blocker"}]})
    assert blocker.status_code == 202
    r = submit(url, session, candidate=GOOD, turn=1, wait=0)
    assert r.status_code == 429 and r.headers["retry-after"]
    assert httpx.get(f"{url}/v1/sessions/{session}", headers=auth()).json()["history"] == []
    gate.set()
    deadline = time.monotonic() + 20
    while (r := submit(url, session, candidate=GOOD, turn=1)).status_code == 429:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert r.status_code == 200 and r.json()["state"] == "judged"


def test_limits_sessions_per_client_keys_bodies_and_bad_input(start_server) -> None:
    url = start_server(ScriptedBackend(), max_sessions_per_client=1, max_source_bytes=4096).url
    first = create(url, key="k1")
    assert create(url, key="k1").json()["session"] == first.json()["session"]  # a retried create
    assert create(url, key="k1", turns=5).status_code == 409
    r = create(url)
    assert r.status_code == 429 and "close finished ones" in r.json()["error"]
    httpx.delete(f"{url}/v1/sessions/{first.json()['session']}", headers=auth())
    second = create(url).json()["session"]
    r = submit(url, second, candidate=GOOD + "#" * 5000, turn=1)
    assert r.status_code == 413
    r = submit(url, second, candidate=GOOD, answer=answer(GOOD))
    assert r.status_code == 400 and "exactly one" in r.json()["error"]
    assert create(url, turns=0).status_code == 400 and create(url, turns=99).status_code == 400
    r = httpx.post(f"{url}/v1/sessions", json={"task": "no/such_task"}, headers=auth())
    assert r.status_code == 400 and "unknown built-in task" in r.json()["error"]
    assert httpx.get(f"{url}/v1/sessions/{'0' * 32}", headers=auth()).status_code == 404
    assert httpx.get(f"{url}/v1/sessions/../v1/info", headers=auth()).status_code == 404
    r = httpx.get(f"{url}/v1/sessions/{second}/prompt", params={"wait": 31}, headers=auth())
    assert r.status_code == 400


def test_a_task_whose_reference_fails_still_gets_a_prompt_that_says_so(start_server) -> None:
    url = start_server(ScriptedBackend()).url
    broken = TASK_SOURCE.replace("return x + 1", "return x + 1  # broken")
    session = httpx.post(f"{url}/v1/sessions", json={"task": broken}, headers=auth()).json()["session"]
    reply = prompt(url, session)
    assert reply["state"] == "ready" and "the task's reference fails" in reply["profile_error"]
    assert "unavailable (the judge has not read this task's shapes yet)" in reply["prompt"]


def test_the_python_client_runs_an_episode(start_server, token_file) -> None:
    url = start_server(ScriptedBackend(), token_file=token_file).url
    client = fast_client(url, token=TOKEN)
    with client.open_session(TASK, turns=2) as session:
        assert TASK_SOURCE.strip() in session.prompt()
        one = session.step(answer(BROKEN))
        assert one.status == "compile_error" and COMPILER_LINE in (one.verdict or "") and not one.done
        assert COMPILER_LINE in session.prompt()
        two = session.step(candidate=GOOD)
        assert two.status == "correct" and two.done and session.next_turn is None
        state = session.state()
        assert state.done and state.returns[0] == pytest.approx(one.reward + 0.4 * two.reward)
        with pytest.raises(ServeError, match="no more turns"):
            session.step(candidate=GOOD)
    assert client.session(session.id).closed
    with pytest.raises(ServeError) as e:
        fast_client(url).create_session(TASK)
    assert e.value.status == 401


def test_sessions_are_kept_in_the_database(start_server, tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    server = start_server(ScriptedBackend(), db_path=db)
    session = create(server.url, turns=2).json()["session"]
    one = submit(server.url, session, candidate=WRONG, turn=1).json()
    server.stop()
    again = start_server(ScriptedBackend(), db_path=db)
    view = httpx.get(f"{again.url}/v1/sessions/{session}", headers=auth()).json()
    assert view["history"][0]["verdict"] == one["verdict"] and view["rewards"] == [one["reward"]]
    assert prompt(again.url, session)["prompt"] == one["prompt"]
