"""Proposals from a local Hugging Face causal LM (the optional extra `transformers`).

Guarantees: the model loads from a local folder on first use (nothing is downloaded: the path
must exist); one generation at a time; the chat template is used when the tokenizer has one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.proposers.base import (
    Proposal,
    ProposalRequest,
    Proposer,
    ProposerError,
    proposal_from_answer,
)


@dataclass(frozen=True, kw_only=True)
class HFConfig:
    path: str
    max_new_tokens: int = 4096
    temperature: float = 0.7
    device: str = "cpu"
    system: str | None = None

    def __post_init__(self) -> None:
        if not self.path:
            raise ProposerError("hf proposer needs a model folder: hf:PATH")
        if self.max_new_tokens < 1:
            raise ProposerError(f"max_new_tokens must be >= 1, not {self.max_new_tokens}")
        if self.temperature < 0:
            raise ProposerError(f"temperature must be >= 0, not {self.temperature}")


class HFProposer(Proposer):
    """A causal LM from a local folder. Loaded on first use; one generation at a time."""

    def __init__(self, config: HFConfig) -> None:
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise ProposerError("hf proposer needs the optional extra: pip install 'kernelrl[hf]' "
                                "(transformers)") from None
        if not Path(config.path).exists():
            raise ProposerError(f"hf proposer: no model folder {config.path}")
        self.config = config
        self.spec = f"hf:{config.path}"
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        if config.system is None:
            from kernelrl.episodes.prompt import system_message

            self._system = system_message()
        else:
            self._system = config.system

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.config.path)
        model = AutoModelForCausalLM.from_pretrained(self.config.path)
        self._model = model.to(self.config.device)  # type: ignore[arg-type]  # transformers' stubs
        self._model.eval()

    def _encode(self, prompt: str) -> Any:
        tok = self._tokenizer
        if getattr(tok, "chat_template", None):
            messages = ([{"role": "system", "content": self._system}] if self._system else []) + [
                {"role": "user", "content": prompt}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = (self._system + "\n\n" if self._system else "") + prompt
        return tok(text, return_tensors="pt").to(self.config.device)

    batched = True

    def propose(self, request: ProposalRequest) -> Proposal:
        return self.propose_many(request, 1)[0]

    def propose_many(self, request: ProposalRequest, n: int) -> list[Proposal]:
        """n samples of one prompt in one `generate` call (greedy decoding gives one answer n times)."""
        import torch

        if n < 1:
            raise ProposerError(f"propose_many: n must be >= 1, not {n}")
        with self._lock:
            if self._model is None:
                self._load()
            inputs = self._encode(request.prompt)
            sample = self.config.temperature > 0
            gen_kwargs: dict[str, Any] = {"max_new_tokens": self.config.max_new_tokens, "do_sample": sample,
                                          "num_return_sequences": n if sample else 1}
            if sample:
                gen_kwargs["temperature"] = self.config.temperature
            pad = self._tokenizer.pad_token_id
            gen_kwargs["pad_token_id"] = pad if pad is not None else self._tokenizer.eos_token_id
            eos = self._tokenizer.eos_token_id
            started = time.monotonic()
            with torch.inference_mode():
                out = self._model.generate(**inputs, **gen_kwargs)
            n_prompt = int(inputs["input_ids"].shape[1])
            latency = round(time.monotonic() - started, 3)
            proposals = []
            for row in out[:, n_prompt:]:
                ids = row.tolist()
                # a finished sample is padded to the batch's longest: its tokens end at its first EOS
                length = ids.index(eos) + 1 if eos in ids else len(ids)
                answer = self._tokenizer.decode(ids[:length], skip_special_tokens=True)
                proposals.append(proposal_from_answer(
                    answer, prompt_tokens=n_prompt, completion_tokens=length,
                    meta={"model": self.config.path, "latency_s": latency,
                          "finish_reason": "stop" if eos in ids[:length] else "length"}))
        return proposals if sample else proposals * n
