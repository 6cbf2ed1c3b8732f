"""Training stages and where their models live: sft -> rft -> grpo, each starting from the last.

Every stage writes into `<output_dir>/<stage>/`: TRL's checkpoints (`checkpoint-N/`), the final
model (`final/`, or `round-K/final/` for rejection sampling) and `stage.json`, written last,
naming the final model. A stage's `init_from = "auto"` starts from the final model of the
latest earlier stage that finished (grpo: rft, else sft; rft: sft), else from the base model;
any other value is a folder or hub id.

Guarantees: `stage.json` is written only after the final model is saved, so a stage that was
interrupted is never taken as a starting point; `resolve_init` says which source it chose and
why (`Init.reason`), for the log.

Does not train: `kernelrl.train.sft`, `rft` and `grpo` do.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field
from pathlib import Path


class Stage(enum.StrEnum):
    SFT = "sft"
    RFT = "rft"
    GRPO = "grpo"


ORDER = (Stage.SFT, Stage.RFT, Stage.GRPO)
AUTO = "auto"
DONE_FILE = "stage.json"


class StageError(RuntimeError):
    """A stage cannot start or continue (no checkpoint to resume, no data); the message says why."""


@dataclass(frozen=True, kw_only=True)
class Init:
    source: str  # a folder or hub id
    reason: str


@dataclass(frozen=True, kw_only=True)
class StageOutcome:
    """What one fine-tuning pass did."""

    final_dir: Path
    steps: int
    train_loss: float | None
    norm_before: float  # L2 norm of the trainable parameters when this invocation began training (after a resume
    # loaded its checkpoint)
    norm_after: float
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def parameters_changed(self) -> bool:
        return self.norm_after != self.norm_before


def checkpoint_to_resume(folder: Path, *, resume: bool) -> str | None:
    """The checkpoint a stage continues from: the last in `folder` with `resume`, else None.

    A stage started afresh over an earlier run's checkpoints would overwrite them: that is
    refused, so nothing already trained is lost by accident.
    """
    from transformers.trainer_utils import get_last_checkpoint

    folder = Path(folder)
    last = get_last_checkpoint(str(folder)) if folder.is_dir() else None  # type: ignore[no-untyped-call]
    if resume and last is None:
        raise StageError(f"--resume: no checkpoint in {folder}")
    if not resume and last is not None:
        raise StageError(f"{folder} holds checkpoints of an earlier run ({Path(last).name}): --resume continues "
                         "it; to start over, remove them or set another output_dir")
    return last


def stage_dir(output_dir: Path, stage: Stage) -> Path:
    return Path(output_dir) / stage.value


def mark_done(output_dir: Path, stage: Stage, final_dir: Path, **extra: object) -> None:
    path = stage_dir(output_dir, stage) / DONE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"final": str(final_dir), "finished": time.time(), **extra}, indent=1, default=str))
    tmp.replace(path)


def finished_model(output_dir: Path, stage: Stage) -> Path | None:
    """The final model of a stage that finished, or None."""
    path = stage_dir(output_dir, stage) / DONE_FILE
    try:
        final = Path(json.loads(path.read_text())["final"])
    except (OSError, ValueError, KeyError):
        return None
    return final if final.is_dir() else None


def resolve_init(stage: Stage, init_from: str, *, output_dir: Path, base: str) -> Init:
    if init_from != AUTO:
        return Init(source=init_from, reason="set by the run config")
    for earlier in reversed(ORDER[: ORDER.index(stage)]):
        found = finished_model(output_dir, earlier)
        if found is not None:
            return Init(source=str(found), reason=f"the {earlier.value} stage's final model")
    return Init(source=base, reason="the base model (no earlier stage has finished)")
