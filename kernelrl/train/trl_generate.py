"""TRL's own generation for one batch of prompts: the one place kernelrl calls TRL's private methods.

A multi-turn rollout (`kernelrl.train.multiturn`) generates every turn with the trainer's own
machinery (transformers' generate, or vLLM when `use_vllm`), so its samples are what TRL would
have sampled. TRL exposes that only through two private methods of `GRPOTrainer`:

- `_tokenize_prompts(prompts) -> (prompt_ids, images, multimodal_fields)`;
- `_generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, ...)
  -> (completion_ids, logprobs)`.

`generate(trainer, prompts)` calls them (text prompts or chats, one completion each, no images)
and decodes the completions. `check_trainer(cls)` compares those methods' parameters with the
ones this module was written against (`PRIVATE_API`, checked on `TESTED_TRL`) and raises
`TrlApiChanged` naming the method when they differ; `generate` checks the trainer's class once
(that the methods exist and take the arguments passed) before its first call, and
tests/train/test_trl_generate.py fails when the installed TRL is not `TESTED_TRL` or its
private methods' parameters changed.

Guarantees: the completions are decoded with the trainer's `processing_class`, special tokens
skipped, then cut like TRL's own completions (`kernelrl.train.model.completion_text`).

Does not support images or several completions per prompt (a rollout asks for one per row).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelrl.train.model import completion_text

if TYPE_CHECKING:
    from kernelrl.train.sampling import Prompt

TESTED_TRL = "1.16.0"  # the TRL version whose private methods this module was checked against
# method -> its leading parameters (after self), as TESTED_TRL declares them
PRIVATE_API: dict[str, tuple[str, ...]] = {
    "_tokenize_prompts": ("prompts",),
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations"),
}


class TrlApiChanged(RuntimeError):
    """TRL's private generation methods are not the ones this adapter calls."""


@dataclass(frozen=True, kw_only=True)
class Generated:
    """One completion per prompt: the token ids TRL trains on, and the decoded answer."""

    prompt_ids: Sequence[Sequence[int]]
    completion_ids: Sequence[Sequence[int]]
    logprobs: Sequence[Sequence[float]] | None  # None: transformers' generate gives none (TRL computes them)
    answers: list[str]


def check_trainer(cls: type, *, names: bool = True) -> None:
    """Raise `TrlApiChanged` unless `cls` has the private methods `PRIVATE_API` describes and
    they take the arguments `generate` passes (`names`: under the same parameter names too)."""
    try:
        import trl

        version = str(getattr(trl, "__version__", "unknown"))
    except ImportError:
        version = "not installed"
    where = f"TRL {version}; kernelrl.train.trl_generate was checked against TRL {TESTED_TRL}"
    for name, expected in PRIVATE_API.items():
        method = getattr(cls, name, None)
        if not callable(method):
            raise TrlApiChanged(f"{cls.__name__}.{name} is gone ({where}): multi-turn GRPO cannot generate a turn")
        signature = inspect.signature(method)
        params = tuple(p for p in signature.parameters if p != "self")
        try:
            signature.bind(None, *([None] * len(expected)))
        except TypeError:
            raise TrlApiChanged(f"{cls.__name__}.{name} takes ({', '.join(params)}), not "
                                f"({', '.join(expected)}, ...) ({where}): update it") from None
        if names and params[:len(expected)] != expected:
            raise TrlApiChanged(f"{cls.__name__}.{name} takes ({', '.join(params)}), not "
                                f"({', '.join(expected)}, ...) ({where}): update it")


_CHECKED: set[str] = set()  # trainer classes checked in this process


def _check_once(cls: type) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}:{id(cls)}"
    if name not in _CHECKED:
        check_trainer(cls, names=False)
        _CHECKED.add(name)


def generate(trainer: Any, prompts: Sequence[Prompt]) -> Generated:
    """One completion of each prompt by the trainer's own generation (see the module docstring)."""
    _check_once(type(trainer))
    prompt_ids, _, _ = trainer._tokenize_prompts(list(prompts))
    completion_ids, logprobs = trainer._generate_single_turn(prompt_ids, None, {}, 1)
    answers = [completion_text(c) for c in trainer.processing_class.batch_decode(completion_ids,
                                                                                 skip_special_tokens=True)]
    return Generated(prompt_ids=prompt_ids, completion_ids=completion_ids, logprobs=logprobs, answers=answers)


__all__ = ["PRIVATE_API", "TESTED_TRL", "Generated", "TrlApiChanged", "check_trainer", "generate"]
