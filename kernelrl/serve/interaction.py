"""verl's multi-turn interaction over the reward server's refinement sessions.

verl's agent loop (multi-turn rollouts with `interaction_config_path`) starts an interaction per
rollout, hands it the conversation after each assistant turn, appends the text it answers as
the next user message, and stops when it says so. `KernelInteraction` is that interaction for
kernels: each rollout is a session on the reward server (`kernelrl.serve.sessions`), each
assistant turn is judged there, and the answer is the verdict as a model should read it.

verl configuration (an interaction config file):

    interaction:
      - name: kernelrl
        class_name: kernelrl.serve.interaction.KernelInteraction
        config: {url: "http://127.0.0.1:8177", token_file: token.txt, turns: 3}

with each dataset row's `interaction_kwargs` naming the task: `{"name": "kernelrl", "task":
"level1/softmax"}` (or a KernelBench-format source with `task_name`), optionally `turns`.
`url` and `token_file` fall back to `KERNELRL_SERVE_URL` and `KERNELRL_SERVE_TOKEN_FILE`;
`size`, `policy`, `gamma` and `timeout_s` (one call, an hour by default) are optional.

- `start_interaction(instance_id, task=..., ...)`: creates the session (the instance id is its
  creation key, so a retried start returns the same session);
- `generate_response(instance_id, messages)`: the last assistant message is the turn's answer;
  returns (done, verdict text, the turn's reward, {turn, correct, speedup, scored}); with no
  assistant message yet, (False, the first prompt, 0.0, {}); a task whose reference fails pays
  0.0 with `scored` 0.0, as `compute_score` does;
- `calculate_score(instance_id)`: the episode's discounted return from its first turn;
- `finalize_interaction(instance_id)`: closes the session.

Duck-typed: verl need not be installed (nothing is imported from it), and the signatures take
the extra keywords verl passes. Does not tokenise, and keeps no state but the session ids: the
sessions live on the server.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from kernelrl.backends.api import BadItem, TurnState, is_task_name, resolve_task
from kernelrl.backends.client import DEFAULT_TIMEOUT_S, ClientConfig, RemoteSession, RewardClient
from kernelrl.serve.verl import ENV_TOKEN_FILE, ENV_URL

DEFAULT_TURNS = 3


class KernelInteraction:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.name = str(self.config.get("name", "kernelrl"))
        url = self.config.get("url") or os.environ.get(ENV_URL)
        if not url:
            raise ValueError(f"KernelInteraction needs the reward server's url (config `url` or {ENV_URL})")
        self.turns = int(self.config.get("turns", DEFAULT_TURNS))
        self.gamma = self.config.get("gamma")
        self.client = RewardClient(str(url), token_file=self.config.get("token_file") or os.environ.get(ENV_TOKEN_FILE),
                                   config=ClientConfig(size=self.config.get("size"), policy=self.config.get("policy"),
                                                       timeout_s=float(self.config.get("timeout_s") or
                                                                       DEFAULT_TIMEOUT_S)))
        self._sessions: dict[str, RemoteSession] = {}
        self._lock = threading.Lock()

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        spec = kwargs.get("task") or kwargs.get("ground_truth")
        if not spec:
            raise ValueError("interaction_kwargs must name the task (`task`: a built-in name or a source)")
        try:
            task = resolve_task(str(spec), None if is_task_name(str(spec)) else kwargs.get("task_name"))
        except BadItem as e:
            raise ValueError(f"kernelrl interaction: not a task: {e}") from None
        session = await asyncio.to_thread(self.client.open_session, task, turns=int(kwargs.get("turns", self.turns)),
                                          gamma=self.gamma, key=instance_id)
        with self._lock:
            self._sessions[instance_id] = session
        return instance_id

    async def generate_response(self, instance_id: str, messages: Sequence[Mapping[str, object]],
                                **kwargs: object) -> tuple[bool, str, float, dict[str, float]]:
        session = self._session(instance_id)
        answer = _last_assistant(messages)
        if answer is None:
            return False, await asyncio.to_thread(session.prompt), 0.0, {}
        turn = await asyncio.to_thread(session.step, answer)
        if turn.state is not TurnState.JUDGED:
            return False, f"This answer could not be judged ({turn.error}); send it again.", 0.0, {"turn": turn.turn}
        metrics = {"turn": turn.turn, "correct": float(turn.status == "correct"), "speedup": float(turn.speedup or 0.0),
                   "scored": float(turn.reward is not None)}
        return turn.done, turn.verdict or "", float(turn.reward or 0.0), metrics

    async def calculate_score(self, instance_id: str | None = None, **kwargs: object) -> float:
        if instance_id is None:
            return 0.0
        state = await asyncio.to_thread(self._session(instance_id).state)
        first = state.returns[0] if state.returns else None
        return float(first or 0.0)

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: object) -> None:
        if instance_id is None:
            return
        with self._lock:
            session = self._sessions.pop(instance_id, None)
        if session is not None:
            await asyncio.to_thread(session.close)

    def _session(self, instance_id: str) -> RemoteSession:
        with self._lock:
            session = self._sessions.get(instance_id)
        if session is None:
            raise KeyError(f"no interaction {instance_id!r} (start_interaction first)")
        return session


def _last_assistant(messages: Sequence[Mapping[str, object]]) -> str | None:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            content = m.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: the text ones
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            return str(content or "")
    return None
