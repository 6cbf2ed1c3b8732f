"""verl's interaction over sessions, called as verl's agent loop calls it: start, one response
per assistant turn (the verdict, the reward, whether to stop), the score, finalise."""

from __future__ import annotations

import asyncio

import pytest
from serve_helpers import COMPILER_LINE, ScriptedBackend

from kernelrl.serve.interaction import KernelInteraction
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
GOOD = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
BROKEN = GOOD.replace("x + 1", "x.plus_one()  # BUILD_FAILS")


def assistant(code: str) -> dict[str, str]:
    return {"role": "assistant", "content": f"Plan: one kernel.\n\n```python\n{code}```\n"}


def test_a_two_turn_rollout_as_verls_agent_loop_drives_it(start_server, token_file) -> None:
    url = start_server(ScriptedBackend(), token_file=token_file).url
    interaction = KernelInteraction({"name": "kernelrl", "url": url, "token_file": str(token_file), "turns": 2,
                                     "gamma": 0.5})

    async def rollout() -> tuple:
        iid = await interaction.start_interaction("rollout-1", task=TASK_SOURCE, task_name="plus_one")
        assert await interaction.start_interaction("rollout-1", task=TASK_SOURCE, task_name="plus_one") == iid
        stop0, prompt, r0, _ = await interaction.generate_response(iid, [])
        messages = [{"role": "user", "content": prompt}, assistant(BROKEN)]
        stop1, feedback1, r1, m1 = await interaction.generate_response(iid, messages)
        messages += [{"role": "user", "content": feedback1}, assistant(GOOD)]
        stop2, feedback2, r2, m2 = await interaction.generate_response(iid, messages, agent_data=object())
        score = await interaction.calculate_score(iid)
        await interaction.finalize_interaction(iid)
        return iid, (stop0, prompt, r0), (stop1, feedback1, r1, m1), (stop2, feedback2, r2, m2), score

    iid, first, one, two, score = asyncio.run(rollout())
    assert first[0] is False and "class Model" in first[1] and first[2] == 0.0
    assert one[0] is False and COMPILER_LINE in one[1] and one[3] == {"turn": 1, "correct": 0.0, "speedup": 0.0,
                                                                      "scored": 1.0}
    assert two[0] is True and two[1].startswith("Correct.") and two[3]["correct"] == 1.0 and two[2] > one[2]
    assert score == pytest.approx(one[2] + 0.5 * two[2])
    # finalised: the session (found again by its creation key, the instance id) is closed
    again = interaction.client.create_session(Task(name="plus_one", source=TASK_SOURCE), turns=2, gamma=0.5, key=iid)
    assert again.closed and again.done and len(again.history) == 2


def test_the_interaction_needs_a_url_and_a_task(monkeypatch) -> None:
    monkeypatch.delenv("KERNELRL_SERVE_URL", raising=False)
    with pytest.raises(ValueError, match="url"):
        KernelInteraction({})
    interaction = KernelInteraction({"url": "http://127.0.0.1:9"})
    with pytest.raises(ValueError, match="name the task"):
        asyncio.run(interaction.start_interaction("x"))
    with pytest.raises(ValueError, match="not a task"):
        asyncio.run(interaction.start_interaction("x", task="no/such_task"))
