"""Every judge the system runs is built here, from its config.

`make_judge(eval_config, backend)` is the judge of a run (`kernelrl.run_parts.build_run`), of verl's
reward (`kernelrl.serve.verl`) and of each lane of the reward server (`kernelrl.serve.lanes`, on Ray
too): the reward server's client when `BackendConfig.url` is set, else an in-process `Evaluator` of
`eval_config`. Whoever calls it owns what it returns and closes it. The judge's own commands
(`kernelrl eval`, `baseline`, `calibrate`, `tasks --shapes`) use an `Evaluator` directly: they
measure this machine's judge, never a server's.

Guarantees: a client asks the server for the config's size and policy unless told to leave them to
the server; nothing is started here beyond what the judge starts itself (an evaluator starts its
workers when it first judges). Does not judge anything, and does not choose devices: a lane's
config already names its device (`kernelrl.serve.lanes.lane_config`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the evaluator (and torch) is imported when a judge is made, not to read a config
    from kernelrl.judge.contract import OwnedJudge
    from kernelrl.judge.eval_config import EvalConfig

SERVER_SETTINGS = frozenset({"size", "policy"})  # what a client may leave to the server


@dataclass(frozen=True, kw_only=True)
class BackendConfig:
    """Where a run's verdicts come from: an in-process evaluator (the run's `eval`), or a reward server."""

    url: str | None = None  # `kernelrl serve`'s address; None: an Evaluator in this process
    token_file: Path | None = None  # this client's bearer token for the server (one line; mode 0600)
    timeout_s: float | None = None  # one batch, client side; None: the client's default (an hour)

    def __post_init__(self) -> None:
        if self.token_file is not None:
            object.__setattr__(self, "token_file", Path(self.token_file))
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError("backend.timeout_s must be positive or unset")


def make_judge(eval_config: EvalConfig, backend: BackendConfig | None = None, *,
               server_chooses: Collection[str] = ()) -> OwnedJudge:
    """A judge of the config's settings: the reward server's client when `backend.url` is set, else an
    in-process evaluator. The client asks the server for the config's `size` and `policy`, except
    those named in `server_chooses`, which are the server's own settings."""
    unknown = set(server_chooses) - SERVER_SETTINGS
    if unknown:
        raise ValueError(f"server_chooses: only {sorted(SERVER_SETTINGS)} are the server's to choose, "
                         f"not {sorted(unknown)}")
    if backend is not None and backend.url:
        from kernelrl.backends.client import DEFAULT_TIMEOUT_S, ClientConfig, RewardClient

        return RewardClient(backend.url, token_file=backend.token_file, config=ClientConfig(
            size=None if "size" in server_chooses else eval_config.size,
            policy=None if "policy" in server_chooses else eval_config.policy,
            timeout_s=backend.timeout_s or DEFAULT_TIMEOUT_S))
    from kernelrl.judge.evaluator import Evaluator

    return Evaluator(eval_config)
