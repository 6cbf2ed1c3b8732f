"""The policy: a causal LM and its tokenizer, loaded from a folder or a hub id, LoRA through peft.

- `load_model(source, config)` calls `AutoTokenizer.from_pretrained` and
  `AutoModelForCausalLM.from_pretrained` on `source` (a local folder or a hub id; nothing else
  decides where weights come from), gives the tokenizer a pad token when it has none (its EOS)
  and pads on the left, as generation needs;
- `peft_config(config)` is the `peft.LoraConfig` a TRL trainer wraps the model with, or None;
- `as_prompt` / `as_completion` put a kernelrl prompt and an answer into the form the model was
  made for: chat messages (system + user, then assistant) when the tokenizer has a chat template,
  else the text `system + "\\n\\n" + prompt`, exactly as the `hf:` proposer asks, so what a stage
  trains on is what `kernelrl bench --proposer hf:PATH` later asks;
- `sample_answers` draws n answers per prompt with `generate` (the CPU fallback of
  `kernelrl.train.sampling`);
- `save_final` writes a stage's model and tokenizer to one folder, a LoRA adapter merged into its
  base when `lora.merge_on_save`, so the next stage and `hf:PATH` load a plain model.

Does not download anything itself and does not choose a model: the run config names it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.train.tiny import TinyModelConfig

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig
    from transformers import TrainerControl, TrainerState, TrainingArguments

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """LoRA adapters through peft (`peft.LoraConfig`'s names)."""

    r: int = 16  # the adapters' rank
    alpha: int = 32  # their scale: updates are multiplied by alpha / r
    dropout: float = 0.05  # dropout on the adapters' input while training
    target_modules: tuple[str, ...] = ("all-linear",)  # peft's shorthand for every linear layer but the head
    merge_on_save: bool = True  # the stage's final folder holds a merged, plain model

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if self.r < 1 or self.alpha < 1:
            raise ValueError("lora r and alpha must be >= 1")
        if not 0 <= self.dropout < 1:
            raise ValueError("lora dropout must be in [0, 1)")
        if not self.target_modules:
            raise ValueError("lora target_modules must name at least one module (or all-linear)")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    path: str  # the base model: a local folder or a hub id
    dtype: str = "auto"  # auto (the checkpoint's), float32, bfloat16, float16
    attn_implementation: str | None = None  # e.g. "sdpa", "flash_attention_2"; None: transformers' choice
    trust_remote_code: bool = False  # run the model folder's own Python code (only for a folder you trust)
    lora: LoraSettings | None = None  # None: full fine-tuning
    # Build a tiny random model at `path` when nothing is there: for CPU smoke runs only.
    tiny: TinyModelConfig | None = None
    system: str | None = None  # system message; None: the prompt templates' system.txt

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("model.path must name a folder or a hub id")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One generated answer."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    truncated: bool  # stopped by max_new_tokens, not by EOS


def is_model_folder(path: str | Path) -> bool:
    """A folder `from_pretrained` can load (a config, or a peft adapter config)."""
    p = Path(path)
    return p.is_dir() and ((p / "config.json").is_file() or (p / "adapter_config.json").is_file())


def load_tokenizer(source: str | Path, config: ModelConfig) -> Any:
    """The tokenizer of a folder or hub id, padding on the left (as generation needs)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=config.trust_remote_code)
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(source: str | Path, config: ModelConfig) -> tuple[Any, Any]:
    """(model, tokenizer) from a folder or hub id, with the config's dtype and attention."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(source, config)
    kwargs: dict[str, Any] = {"trust_remote_code": config.trust_remote_code,
                              "dtype": "auto" if config.dtype == "auto" else getattr(torch, config.dtype)}
    if config.attn_implementation:
        kwargs["attn_implementation"] = config.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(str(source), **kwargs)
    vocab = model.get_input_embeddings().num_embeddings
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id >= vocab:
        # A tokenizer class chosen by model type may bring a pad token the checkpoint's vocabulary
        # does not have (transformers adds Qwen2's <|endoftext|>): pad with EOS instead.
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def peft_config(config: ModelConfig) -> LoraConfig | None:
    """peft's LoraConfig for the trainer, or None for full fine-tuning."""
    if config.lora is None:
        return None
    from peft import LoraConfig

    lora = config.lora
    targets: str | list[str] = "all-linear" if lora.target_modules == ("all-linear",) else list(lora.target_modules)
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                      task_type="CAUSAL_LM")


def system_text(config: ModelConfig) -> str:
    if config.system is not None:
        return config.system
    from kernelrl.episodes.prompt import system_message

    return system_message()


def has_chat_template(tokenizer: object) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def as_prompt(tokenizer: object, prompt: str, system: str) -> str | list[dict[str, str]]:
    """The prompt as the model takes it (see the module docstring)."""
    if has_chat_template(tokenizer):
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return f"{system}\n\n{prompt}" if system else prompt


def as_completion(tokenizer: object, answer: str) -> str | list[dict[str, str]]:
    if has_chat_template(tokenizer):
        return [{"role": "assistant", "content": answer}]
    return answer


def completion_text(completion: object) -> str:
    """A TRL completion (a string, or a list of chat messages) as the answer's text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence):
        parts = [m.get("content") or "" for m in completion if isinstance(m, dict) and m.get("role", "assistant")
                 == "assistant"]
        return "".join(str(p) for p in parts)
    return str(completion)


def prompt_text(prompt: object) -> str:
    """A TRL prompt (a string, or chat messages) as the user's text, for the code database."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        users = [m.get("content") or "" for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


def sample_answers(model: Any, tokenizer: Any, prompts: Sequence[str | list[dict[str, str]]], *, n: int,
                   max_new_tokens: int, temperature: float, batch_size: int = 4) -> list[list[Sample]]:
    """n sampled answers per prompt (greedy when temperature is 0, then the n are equal)."""
    import torch

    if n < 1 or max_new_tokens < 1:
        raise ValueError("need n >= 1 and max_new_tokens >= 1")
    device = next(model.parameters()).device
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if not isinstance(p, str)
             else p for p in prompts]
    eos = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    out: list[list[Sample]] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            sampled = temperature > 0
            # Greedy decoding gives one answer per prompt (generate refuses more); it is repeated.
            kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "num_return_sequences": n if sampled else 1,
                                      "do_sample": sampled, "pad_token_id": tokenizer.pad_token_id}
            if sampled:
                kwargs["temperature"] = temperature
            with torch.inference_mode():
                generated = model.generate(**enc, **kwargs)
            if not sampled:
                generated = generated.repeat_interleave(n, dim=0)
            width = enc["input_ids"].shape[1]
            for i in range(len(chunk)):
                n_prompt = int(enc["attention_mask"][i].sum())
                samples = []
                for j in range(n):
                    ids = generated[i * n + j, width:].tolist()
                    cut = next((k for k, t in enumerate(ids) if t in eos), None)
                    kept = ids if cut is None else ids[:cut]
                    samples.append(Sample(text=tokenizer.decode(kept, skip_special_tokens=True), prompt_tokens=n_prompt,
                                          completion_tokens=len(kept), truncated=cut is None))
                out.append(samples)
    finally:
        model.train(was_training)
    return out


def trainable_norm(model: Any) -> float:  # a transformers model, or a trainer's (typed as optional)
    """L2 norm of the trainable parameters: a cheap before/after check that training moved them."""
    total = 0.0
    for p in model.parameters():
        if p.requires_grad:
            total += float(p.detach().float().pow(2).sum())
    return math.sqrt(total)


def norm_probe() -> Any:
    """A TrainerCallback that records `trainable_norm` when training begins, after a resumed run
    has loaded its checkpoint: the norm this invocation starts from."""
    from transformers import TrainerCallback

    class NormProbe(TrainerCallback):
        before: float | None = None

        def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           model: torch.nn.Module | None = None, **kwargs: object) -> TrainerControl:
            if model is not None:
                self.before = trainable_norm(model)
            return control

    return NormProbe()


def save_final(trainer: Any, tokenizer: Any, folder: Path, config: ModelConfig) -> Path:
    """The trained model and its tokenizer in `folder` (merged when LoRA and merge_on_save)."""
    folder = Path(folder)
    if config.lora is not None and config.lora.merge_on_save:
        # The adapter is kept next to the merged model: it is small and what a LoRA run produced.
        trainer.save_model(str(folder / "adapter"))
        if trainer.accelerator.is_main_process:
            model = trainer.accelerator.unwrap_model(trainer.model)
            merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
            merged.save_pretrained(str(folder))
            tokenizer.save_pretrained(str(folder))
        return folder
    trainer.save_model(str(folder))
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(str(folder))
    return folder
