"""Shared programs and helpers for the proposer tests (not a test module)."""

from __future__ import annotations

import types

from kernelrl.proposers import ProposalRequest, make_proposer
from kernelrl.proposers.openai_compat import OpenAIProposer
from kernelrl.tasks.sizes import instantiate
from kernelrl.tasks.task import Task
from openai_server import OpenAIServer

GOOD = ("The reference pays for autograd; this does not.\n\n```python\nimport torch\nimport torch.nn as nn\n\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x + 1\n```\n")

LINEAR = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim):
        super(Model, self).__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.lin(x)) + 0.5

batch_size = 8
dim = 32

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [dim]
"""

CONV_BN = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))

batch_size = 4
cin = 3
cout = 8

def get_inputs():
    return [torch.randn(batch_size, cin, 16, 16)]

def get_init_inputs():
    return [cin, cout]
"""

CONV = CONV_BN.replace("        self.bn = nn.BatchNorm2d(cout)\n", "").replace("self.bn(self.conv(x))", "self.conv(x)")


def make_task(name: str = "toy/linear", source: str = LINEAR) -> Task:
    return Task(name=name, source=source)


def profile_of(task: Task, size: str = "full"):
    """The judge's profile of a task, computed in this process (tests may run task code; the
    judge does it in a reference worker)."""
    from kernelrl.judge.harness.profile import profile_task

    tm = instantiate(task, size)
    return profile_task(tm.module, task=task.name, size=size, constants=tm.constants,
                        init_inputs=tm.get_init_inputs(), source=task.source)


def request(task: Task | None = None, prompt: str = "make it faster", parent: str | None = None,
            chain: int = 0, step: int = 0) -> ProposalRequest:
    task = task or make_task()
    return ProposalRequest(task=task, prompt=prompt, parent=parent, chain=chain, step=step, profile=profile_of(task))


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def openai_proposer(server: OpenAIServer, **opts) -> OpenAIProposer:
    opts.setdefault("api_key", "test-key")
    opts.setdefault("base_url", server.base_url)
    opts.setdefault("backoff_initial_s", 0.01)
    opts.setdefault("backoff_max_s", 5.0)
    opts.setdefault("timeout_s", 10.0)
    proposer = make_proposer("openai:scripted-model", **opts)
    assert isinstance(proposer, OpenAIProposer)
    return proposer


def load_program(source: str) -> types.ModuleType:
    """A generated program as a module (our own programs: run in this process on purpose)."""
    mod = types.ModuleType("candidate")
    exec(compile(source, "<candidate>", "exec"), mod.__dict__)  # noqa: S102
    return mod
