"""Sampling answers for rejection-sampling rounds: vLLM when it is installed, `generate` otherwise.

`SamplingConfig` (`[rft.sampling]` in a run config) picks the engine:

- `engine = "auto"` (default): vLLM when it is importable and CUDA is available, else `hf`;
- `engine = "hf"`: transformers' `generate` (`kernelrl.train.model.sample_answers`) on this
  process's device (`cuda:<local rank>` when CUDA is available, else the CPU): the CPU fallback;
- `engine = "vllm"`, `vllm_mode = "colocate"`: a `vllm.LLM` on this process's GPU (one
  engine per rank, as TRL's colocate mode does), freed when the round's sampling ends so the
  fine-tune gets the memory back;
- `engine = "vllm"`, `vllm_mode = "server"`: a running `trl vllm-serve` (TRL's `VLLMClient`);
  the main process first pushes the weights of the model to sample from (the server may hold
  the previous round's), then every rank sends its own part.

With several processes the work is split by `share`: sample `i` of the round goes to rank
`i mod count`, so the parts are disjoint and together are the whole round (no duplicates).

Guarantees: `sample(prompts, counts)` returns `counts[i]` answers for prompt `i`, in order;
nothing is loaded until a rank has something to sample.

Does not judge or store answers (`kernelrl.train.rft` does) and does not install vLLM (the
`gpu` extra does, on machines with CUDA). The vLLM paths are exercised here against a stand-in
`vllm` module only; they run for real on a GPU machine with the `gpu` extra.
"""

from __future__ import annotations

import enum
import gc
import importlib.util
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kernelrl.train.model import ModelConfig, Sample, load_model, sample_answers
from kernelrl.train.ranks import Ranks, local_device_index

T = TypeVar("T")
# transformers' from_pretrained patches process-wide initialisers while it loads: one load at a time
# in a process (ranks are processes; tests run ranks as threads of one).
_LOADING = threading.Lock()
Prompt = str | list[dict[str, str]]


class Engine(enum.StrEnum):
    AUTO = "auto"
    HF = "hf"
    VLLM = "vllm"


class VLLMMode(enum.StrEnum):
    COLOCATE = "colocate"
    SERVER = "server"


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    engine: Engine = Engine.AUTO
    vllm_mode: VLLMMode = VLLMMode.COLOCATE
    vllm_gpu_memory_utilization: float = 0.85  # colocate: the fine-tune starts after vLLM is freed
    vllm_max_model_len: int | None = None  # None: the model's
    vllm_server_base_url: str | None = None  # server: e.g. http://127.0.0.1:8000; None: host and port
    vllm_server_host: str = "127.0.0.1"
    vllm_server_port: int = 8000
    vllm_server_timeout_s: float = 240.0  # how long to wait for the server to answer its health check

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", Engine(self.engine))
        object.__setattr__(self, "vllm_mode", VLLMMode(self.vllm_mode))
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError("rft.sampling.vllm_gpu_memory_utilization must be in (0, 1]")
        if self.vllm_max_model_len is not None and self.vllm_max_model_len < 1:
            raise ValueError("rft.sampling.vllm_max_model_len must be >= 1 or unset")


class Sampler(Protocol):
    def sample(self, prompts: Sequence[Prompt], counts: Sequence[int], *, max_new_tokens: int,
               temperature: float) -> list[list[Sample]]: ...

    def close(self) -> None: ...


def share(items: Sequence[T], ranks: Ranks) -> list[T]:
    """This rank's part of the work: items[rank::count]."""
    return list(items[ranks.index::ranks.count])


def vllm_available() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_engine(config: SamplingConfig) -> Engine:
    if config.engine is Engine.AUTO:
        return Engine.VLLM if vllm_available() else Engine.HF
    if config.engine is Engine.VLLM and importlib.util.find_spec("vllm") is None:
        raise RuntimeError("rft.sampling.engine = vllm, but vllm is not installed (pip install 'kernelrl[gpu]' "
                           "on a machine with CUDA)")
    return config.engine


def open_sampler(config: SamplingConfig, *, source: str, model: ModelConfig, ranks: Ranks, seed: int) -> Sampler:
    """The sampler of one round, for the model at `source`. Every rank calls it (server mode
    pushes the weights from the main process and waits for it)."""
    engine = resolve_engine(config)
    if engine is Engine.HF:
        return HFSampler(source, model, ranks, seed=seed)
    if config.vllm_mode is VLLMMode.COLOCATE:
        return VLLMColocateSampler(config, source, model, ranks, seed=seed)
    return VLLMServerSampler(config, source, model, ranks, seed=seed)


def _by_count(counts: Sequence[int]) -> dict[int, list[int]]:
    """Prompt indices grouped by how many answers they need (one generate call per group)."""
    out: dict[int, list[int]] = {}
    for i, n in enumerate(counts):
        if n > 0:
            out.setdefault(n, []).append(i)
    return out


class HFSampler:
    """transformers' `generate` on this rank's device; the model is loaded on first use."""

    def __init__(self, source: str, model: ModelConfig, ranks: Ranks, *, seed: int, batch_size: int = 4) -> None:
        self.source, self.model_cfg, self.ranks, self.seed, self.batch_size = source, model, ranks, seed, batch_size
        self._loaded: tuple[Any, Any] | None = None

    def _load(self) -> tuple[Any, Any]:
        if self._loaded is None:
            import torch

            with _LOADING:
                policy, tokenizer = load_model(self.source, self.model_cfg)
            if torch.cuda.is_available():
                policy = policy.to(f"cuda:{local_device_index(self.ranks)}")
            torch.manual_seed(self.seed + self.ranks.index)
            self._loaded = (policy, tokenizer)
        return self._loaded

    def sample(self, prompts: Sequence[Prompt], counts: Sequence[int], *, max_new_tokens: int,
               temperature: float) -> list[list[Sample]]:
        out: list[list[Sample]] = [[] for _ in prompts]
        for n, members in _by_count(counts).items():
            policy, tokenizer = self._load()
            got = sample_answers(policy, tokenizer, [prompts[i] for i in members], n=n, max_new_tokens=max_new_tokens,
                                 temperature=temperature, batch_size=self.batch_size)
            for i, samples in zip(members, got):
                out[i] = samples
        return out

    def close(self) -> None:
        self._loaded = None
        gc.collect()


def _as_text(tokenizer: Any, prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return str(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))


class VLLMColocateSampler:
    """One `vllm.LLM` on this rank's GPU, built on first use, freed by `close`."""

    def __init__(self, config: SamplingConfig, source: str, model: ModelConfig, ranks: Ranks, *, seed: int) -> None:
        self.config, self.source, self.model_cfg, self.ranks, self.seed = config, source, model, ranks, seed
        self._llm: Any = None
        self._tokenizer: Any = None

    def _engine(self) -> tuple[Any, Any]:
        if self._llm is None:
            from transformers import AutoTokenizer
            from vllm import LLM

            kwargs: dict[str, Any] = {"model": self.source, "tensor_parallel_size": 1,
                                      "gpu_memory_utilization": self.config.vllm_gpu_memory_utilization,
                                      "seed": self.seed + self.ranks.index,
                                      "trust_remote_code": self.model_cfg.trust_remote_code}
            if self.model_cfg.dtype != "auto":
                kwargs["dtype"] = self.model_cfg.dtype
            if self.config.vllm_max_model_len is not None:
                kwargs["max_model_len"] = self.config.vllm_max_model_len
            if self.ranks.count > 1:
                # Started by accelerate, not by vLLM: each rank's engine lives in its own process.
                kwargs["distributed_executor_backend"] = "external_launcher"
            self._llm = LLM(**kwargs)
            self._tokenizer = AutoTokenizer.from_pretrained(self.source,
                                                            trust_remote_code=self.model_cfg.trust_remote_code)
        return self._llm, self._tokenizer

    def sample(self, prompts: Sequence[Prompt], counts: Sequence[int], *, max_new_tokens: int,
               temperature: float) -> list[list[Sample]]:
        out: list[list[Sample]] = [[] for _ in prompts]
        for n, members in _by_count(counts).items():
            from vllm import SamplingParams

            llm, tokenizer = self._engine()
            params = SamplingParams(n=n, temperature=temperature, max_tokens=max_new_tokens)
            results = llm.generate([_as_text(tokenizer, prompts[i]) for i in members], params, use_tqdm=False)
            for i, result in zip(members, results):
                n_prompt = len(result.prompt_token_ids or ())
                out[i] = [Sample(text=o.text, prompt_tokens=n_prompt, completion_tokens=len(o.token_ids),
                                 truncated=o.finish_reason == "length") for o in result.outputs]
        return out

    def close(self) -> None:
        self._llm = None
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class VLLMServerSampler:
    """A running `trl vllm-serve`: the main process loads `source` and pushes its weights to the
    server (NCCL, TRL's weight-transfer engine), then every rank asks for its part."""

    def __init__(self, config: SamplingConfig, source: str, model: ModelConfig, ranks: Ranks, *, seed: int) -> None:
        from transformers import AutoTokenizer
        from trl.generation.vllm_client import VLLMClient

        self.seed = seed + ranks.index  # ranks sample the same prompts: different seeds, different answers
        self.client = VLLMClient(base_url=config.vllm_server_base_url, host=config.vllm_server_host,
                                 server_port=config.vllm_server_port, connection_timeout=config.vllm_server_timeout_s)
        self.tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=model.trust_remote_code)
        if ranks.is_main:
            import torch

            policy, _ = load_model(source, model)
            policy = policy.to(f"cuda:{local_device_index(ranks)}")
            self.client.init_communicator(device=torch.device(f"cuda:{local_device_index(ranks)}"))
            self.client.update_model_params(policy)
            self.client.reset_prefix_cache()  # type: ignore[no-untyped-call]
            self.client.close_communicator()  # type: ignore[no-untyped-call]
            del policy
            gc.collect()
            torch.cuda.empty_cache()
        ranks.barrier()  # nobody samples before the server holds this round's weights

    def sample(self, prompts: Sequence[Prompt], counts: Sequence[int], *, max_new_tokens: int,
               temperature: float) -> list[list[Sample]]:
        out: list[list[Sample]] = [[] for _ in prompts]
        eos = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id} - {None}
        for n, members in _by_count(counts).items():
            got = self.client.generate(prompts=[_as_text(self.tokenizer, prompts[i]) for i in members], n=n,
                                       temperature=temperature, max_tokens=max_new_tokens, logprobs=None,
                                       generation_kwargs={"seed": self.seed})
            for k, i in enumerate(members):
                n_prompt = len(got["prompt_ids"][k])
                for ids in got["completion_ids"][k * n:(k + 1) * n]:
                    ended = bool(ids) and ids[-1] in eos
                    kept = ids[:-1] if ended else ids
                    out[i].append(Sample(text=str(self.tokenizer.decode(kept, skip_special_tokens=True)),
                                         prompt_tokens=n_prompt, completion_tokens=len(kept), truncated=not ended))
        return out

    def close(self) -> None:
        pass
