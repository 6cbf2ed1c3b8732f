"""`[launch]` of a run config: how many processes each stage runs on, and which accelerate config
file starts them (a name in `kernelrl/configs/accelerate/`, e.g. `zero3`, or a .yaml path).

Its own module because the run config (`kernelrl.train.recipe.TrainConfig`) holds it and the
launch checks (`kernelrl.train.launch`) read the whole run config: with the settings here, each
of those imports the one below it and nothing imports back.

Guarantees: a `LaunchConfig` that exists is consistent (counts >= 1, several processes only with
an accelerate config). Does not check that the accelerate file exists or parses: the dry run does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernelrl.config import CONFIG_DIR
from kernelrl.train.stage import Stage

ACCELERATE_CONFIG_DIR = CONFIG_DIR / "accelerate"


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    accelerate_config: str | None = None  # kernelrl/configs/accelerate/NAME.yaml or a .yaml file; None: one process
    sft_processes: int = 1
    rft_processes: int = 1
    grpo_processes: int = 1
    grpo_visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES of the GRPO launch (a GPU left for vLLM)
    node_gpus: int | None = None  # GPUs of the training node, for the layout's count; None: not stated
    judge_gpus: int = 0  # GPUs the reward server (backend.url) judges on, on its own machine

    def __post_init__(self) -> None:
        if min(self.sft_processes, self.rft_processes, self.grpo_processes) < 1:
            raise ValueError("launch: process counts must be >= 1")
        if self.judge_gpus < 0 or (self.node_gpus is not None and self.node_gpus < 1):
            raise ValueError("launch: judge_gpus must be >= 0 and node_gpus >= 1 or unset")
        if self.accelerate_config is None and max(self.sft_processes, self.rft_processes, self.grpo_processes) > 1:
            raise ValueError("launch: several processes need an accelerate_config")

    def processes(self, stage: Stage) -> int:
        return int(getattr(self, f"{Stage(stage).value}_processes"))

    def accelerate_file(self) -> Path | None:
        if self.accelerate_config is None:
            return None
        path = Path(self.accelerate_config)
        if path.suffix in (".yaml", ".yml", ".json"):
            return path
        return ACCELERATE_CONFIG_DIR / f"{self.accelerate_config}.yaml"
