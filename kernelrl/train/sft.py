"""Stage 1, supervised fine-tuning on the SFT set: a thin wrapper over TRL's `SFTTrainer`.

The SFT set's rows (`kernelrl.train.sft_set`) become prompt-completion pairs in the form the
model takes (`kernelrl.train.model.as_prompt` / `as_completion`: chat messages when the
tokenizer has a chat template), so TRL computes the loss on the answers only (its
`completion_only_loss`, on by default for this format). Every TRL option is set in the run
config's `[sft.trl]` table under TRL's own name; LoRA comes from `[model.lora]` through peft.

`finetune` is the one fine-tuning pass, shared with the rejection-sampling rounds.

Guarantees: with `resume`, training continues from the last checkpoint in the stage's folder
(a `StageError` when there is none); the final model is saved before the stage is marked done.

Does not collect data (`kernelrl collect` does) or judge anything.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.train.model import (
    ModelConfig,
    as_completion,
    as_prompt,
    load_model,
    norm_probe,
    peft_config,
    save_final,
    system_text,
    trainable_norm,
)
from kernelrl.train.sft_set import SFTRow
from kernelrl.train.stage import StageError, StageOutcome, checkpoint_to_resume
from kernelrl.train.trl_args import build_args, check_keys, trl_class

if TYPE_CHECKING:
    from datasets import Dataset


@dataclass(frozen=True, kw_only=True)
class SFTStageConfig:
    init_from: str = "auto"  # "auto": the base model (see kernelrl.train.stage); or a folder / hub id
    data: Path | None = None  # the SFT set (JSONL from `kernelrl collect`); None: <output_dir>/sft.jsonl
    min_speedup: float | None = None  # keep only rows at least this fast; None: every accepted row
    trl: dict[str, Any] = field(default_factory=dict)  # TRL SFTConfig settings, by TRL's names

    def __post_init__(self) -> None:
        if self.data is not None:
            object.__setattr__(self, "data", Path(self.data))
        if self.min_speedup is not None and self.min_speedup <= 0:
            raise ValueError("sft.min_speedup must be positive or unset")
        check_keys(trl_class("SFTConfig"), self.trl, where="sft.trl")


def sft_dataset(rows: Sequence[SFTRow], tokenizer: Any, system: str) -> Dataset:
    from datasets import Dataset

    return Dataset.from_list([{"prompt": as_prompt(tokenizer, r.prompt, system),
                               "completion": as_completion(tokenizer, r.answer)} for r in rows])


def finetune(rows: Sequence[SFTRow], *, source: str, model: ModelConfig, trl: Mapping[str, object], output_dir: Path,
             resume: bool = False, where: str = "sft.trl") -> StageOutcome:
    """One SFT pass over `rows`, starting from `source`; the model lands in `output_dir/final`."""
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    if not rows:
        raise StageError("no rows to fine-tune on")
    started = time.monotonic()
    output_dir = Path(output_dir)
    checkpoint = checkpoint_to_resume(output_dir, resume=resume)
    args = build_args(SFTConfig, trl, output_dir=output_dir, where=where)
    policy, tokenizer = load_model(source, model)
    # SFT pads on the right (TRL's collator pads itself; generation is not involved here).
    tokenizer.padding_side = "right"
    probe = norm_probe()
    trainer = SFTTrainer(model=policy, args=args, train_dataset=sft_dataset(rows, tokenizer, system_text(model)),
                         processing_class=tokenizer, peft_config=peft_config(model), callbacks=[probe])
    before = trainable_norm(trainer.model)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    before = probe.before if probe.before is not None else before
    after = trainable_norm(trainer.model)
    tokenizer.padding_side = "left"
    final = save_final(trainer, tokenizer, output_dir / "final", model)
    metrics = {k: float(v) for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    return StageOutcome(final_dir=final, steps=int(trainer.state.global_step), train_loss=result.training_loss,
                        norm_before=before, norm_after=after, seconds=time.monotonic() - started, metrics=metrics)


def select_rows(rows: Sequence[SFTRow], min_speedup: float | None) -> list[SFTRow]:
    if min_speedup is None:
        return list(rows)
    return [r for r in rows if r.speedup is not None and r.speedup >= min_speedup]
