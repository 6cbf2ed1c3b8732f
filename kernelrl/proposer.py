"""Proposers: where candidate programs come from, behind one interface.

`make_proposer(spec, **opts)` parses a spec:
- `openai:MODEL` any OpenAI-compatible chat endpoint through the official `openai` client.
  Configured by OPENAI_BASE_URL / OPENAI_API_KEY or the options `base_url`, `api_key`;
  `temperature`, `max_tokens` (`max_tokens_field="max_completion_tokens"` for models that
  want the newer name; a 400 asking for it switches once by itself), `concurrency` (requests in flight at once, shared by every
  thread using the proposer), `timeout_s`, and the retry policy (`max_retries`,
  `backoff_initial_s`, `backoff_max_s`, `backoff_jitter`).
- `hf:PATH` a local Hugging Face causal LM (needs the optional extra `transformers`).
- `replay:PATH` a JSONL file of rows `{"task": NAME, "code": ...}` or `{"task": NAME,
  "answer": ...}` (optional `prompt_tokens`, `completion_tokens`), or a folder of .py files.
  A file's task is named by a `# task: NAME` line among its first 10 lines; failing that by its
  path relative to the folder without `.py` and without a trailing `__N` or `.N` counter
  (`level1/matmul__2.py` -> `level1/matmul`); a name matches a task whose full name or last
  path component equals it. Rows are handed out per task in file order (folders: natural sort
  order), each once, across all chains.
- `heuristic` offline and model-free: a portfolio of known program-level rewrites of the
  reference (inference mode, torch.compile modes, channels_last for convolutions, oneDNN
  freezing on CPU, CUDA graphs on GPU, and combinations). Its programs embed a renamed copy of
  the reference and call it, so they are for the `open` policy only; asking for it under
  `strict` is an error.

Guarantees:
- `propose` returns a `Proposal` for every answer a model gave, well-formed or not: an answer
  without a complete code block (empty, prose only, truncated) has `code=None` and keeps the raw
  text, so the caller records it;
- a finite proposer (`replay`, `heuristic`) raises `Exhausted` when it has nothing left for the
  requested task; the caller ends that chain;
- an endpoint that still fails after the retry policy is spent raises `ProposerUnavailable`;
  a bad spec or option raises `ProposerError` with a one-line message;
- proposers are safe to call from several threads at once.

Does not judge the programs: that is the evaluator's work.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.candidate import extract_code
from kernelrl.task import Task, natural_key


class ProposerError(RuntimeError):
    """A proposer cannot be built or used; the message says why, for a person."""


class Exhausted(ProposerError):
    """A finite proposer has no more programs for the requested task."""


class ProposerUnavailable(ProposerError):
    """The model endpoint kept failing after every retry the policy allows."""


@dataclass(frozen=True, kw_only=True)
class ProposalRequest:
    """One ask: improve `task`. `parent` is the source of the chain's current best (None at first)."""

    task: Task
    prompt: str
    parent: str | None = None
    chain: int = 0
    step: int = 0


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """What came back. `code` is None when the answer holds no complete program."""

    answer: str
    code: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def proposal_from_answer(answer: str | None, *, prompt_tokens: int = 0, completion_tokens: int = 0,
                         meta: dict[str, Any] | None = None) -> Proposal:
    text = answer or ""
    return Proposal(answer=text, code=extract_code(text), prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens, meta=dict(meta or {}))


class Proposer(ABC):
    """Turns a request into a proposal. Implementations are thread-safe."""

    spec: str

    @abstractmethod
    def propose(self, request: ProposalRequest) -> Proposal: ...

    def close(self) -> None:
        """Release clients or models; the default has nothing to release."""


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible endpoints


# Statuses worth retrying: request timeout, conflict (some gateways), rate limit, server errors.
RETRY_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with jitter. Attempt n (0-based) waits initial * 2**n, capped at
    max_s, times a uniform factor in [1 - jitter, 1 + jitter]; a server's Retry-After is honoured
    (never waiting less than it asks, never more than max_s)."""

    max_retries: int = 4
    initial_s: float = 1.0
    max_s: float = 60.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ProposerError(f"max_retries must be >= 0, not {self.max_retries}")
        if self.initial_s < 0 or self.max_s < 0 or self.max_s < self.initial_s:
            raise ProposerError("backoff times must satisfy 0 <= initial_s <= max_s")
        if not 0 <= self.jitter < 1:
            raise ProposerError(f"jitter must be in [0, 1), not {self.jitter}")

    def delay_s(self, attempt: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        base = min(self.max_s, self.initial_s * (2.0 ** attempt))
        delay = base * (1.0 + self.jitter * rng.uniform(-1.0, 1.0))
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.max_s))
        return min(delay, self.max_s)

    @staticmethod
    def retryable(error: BaseException) -> bool:
        """Timeouts, connection failures, 408/409/429 and every 5xx are retried; other 4xx are not."""
        import openai

        if isinstance(error, openai.APIConnectionError):  # includes APITimeoutError
            return True
        if isinstance(error, openai.APIStatusError):
            return error.status_code in RETRY_STATUSES or error.status_code >= 500
        return False


def retry_after_s(error: BaseException) -> float | None:
    """Seconds a server asked us to wait (Retry-After or retry-after-ms header), if any."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None


@dataclass(kw_only=True)
class Usage:
    """Totals over a proposer's life, for token budgets and reports."""

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class OpenAIConfig:
    model: str
    base_url: str | None = None  # None: OPENAI_BASE_URL, else the client's default
    api_key: str | None = None  # None: OPENAI_API_KEY
    temperature: float = 0.7
    max_tokens: int = 8192
    # The request field that carries max_tokens. Newer OpenAI models take only
    # "max_completion_tokens"; a 400 that names it switches to it once, by itself.
    max_tokens_field: str = "max_tokens"
    concurrency: int = 4
    timeout_s: float = 600.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    system: str | None = None  # None: the system.txt template

    def __post_init__(self) -> None:
        if not self.model:
            raise ProposerError("openai proposer needs a model name: openai:MODEL")
        if self.concurrency < 1:
            raise ProposerError(f"concurrency must be >= 1, not {self.concurrency}")
        if self.max_tokens < 1:
            raise ProposerError(f"max_tokens must be >= 1, not {self.max_tokens}")
        if self.max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise ProposerError("max_tokens_field must be max_tokens or max_completion_tokens, "
                                f"not {self.max_tokens_field!r}")
        if not 0 <= self.temperature <= 2:
            raise ProposerError(f"temperature must be in [0, 2], not {self.temperature}")
        if self.timeout_s <= 0:
            raise ProposerError(f"timeout_s must be > 0, not {self.timeout_s}")


class OpenAIProposer(Proposer):
    """Chat completions with an explicit retry policy (the client's own retries are off, so
    every attempt, wait and failure is ours to count and test) and a shared concurrency limit."""

    def __init__(self, config: OpenAIConfig, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        import openai

        self.config = config
        self.spec = f"openai:{config.model}"
        api_key = config.api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            raise ProposerError("openai proposer needs an API key: set OPENAI_API_KEY or pass api_key "
                                "(local servers accept any non-empty key)")
        base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or None
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=config.timeout_s, max_retries=0)
        self.base_url = str(self._client.base_url)
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._tokens_field = config.max_tokens_field
        self.usage = Usage()
        if config.system is None:
            from kernelrl.prompt import system_message

            self._system = system_message()
        else:
            self._system = config.system

    def _messages(self, prompt: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self._system}] if self._system else []
        return messages + [{"role": "user", "content": prompt}]

    def propose(self, request: ProposalRequest) -> Proposal:
        cfg = self.config
        failures: list[str] = []
        started = time.monotonic()
        retries = 0  # failed attempts that the retry policy has paid for
        switched = False
        while True:
            try:
                # The slot is held only while a request is in flight, not while backing off.
                with self._slots:
                    response = self._client.chat.completions.create(
                        model=cfg.model, messages=self._messages(request.prompt),
                        temperature=cfg.temperature, **{self._tokens_field: cfg.max_tokens})
            except Exception as e:  # noqa: BLE001 - classified below; anything unknown is re-raised
                failures.append(f"{type(e).__name__}: {_one_line(e)}")
                if not switched and self._tokens_field == "max_tokens" and _wants_completion_tokens(e):
                    # Not a failure of the endpoint: it only wants the newer field name.
                    self._tokens_field, switched = "max_completion_tokens", True
                    continue
                if not RetryPolicy.retryable(e):
                    if _is_openai_error(e):
                        raise ProposerUnavailable(f"{self.spec}: {failures[-1]}") from e
                    raise
                if retries >= cfg.retry.max_retries:
                    raise ProposerUnavailable(f"{self.spec}: gave up after {len(failures)} attempts; "
                                              f"last error {failures[-1]}") from e
                delay = cfg.retry.delay_s(retries, self._rng, retry_after_s(e))
                retries += 1
                with self._lock:
                    self.usage.retries += 1
                self._sleep(delay)
                continue
            return self._to_proposal(response, len(failures) + 1, failures, time.monotonic() - started)

    def _to_proposal(self, response: Any, requests: int, failures: list[str], elapsed_s: float) -> Proposal:
        choice = response.choices[0] if getattr(response, "choices", None) else None
        content = choice.message.content if choice is not None and choice.message is not None else None
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        with self._lock:
            self.usage.requests += 1
            self.usage.prompt_tokens += prompt_tokens
            self.usage.completion_tokens += completion_tokens
        meta = {
            "model": getattr(response, "model", None) or self.config.model,
            "finish_reason": getattr(choice, "finish_reason", None),
            "attempts": requests,
            "errors": failures,
            "latency_s": round(elapsed_s, 3),
            "usage_reported": usage is not None,
        }
        return proposal_from_answer(content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                    meta=meta)

    def close(self) -> None:
        self._client.close()


def _wants_completion_tokens(e: BaseException) -> bool:
    import openai

    return (isinstance(e, openai.BadRequestError)
            and "max_completion_tokens" in str(e) and "max_tokens" in str(e).replace("max_completion_tokens", ""))


def _is_openai_error(e: BaseException) -> bool:
    import openai

    return isinstance(e, openai.OpenAIError)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


# ---------------------------------------------------------------------------------------------
# Local Hugging Face models


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
            from kernelrl.prompt import system_message

            self._system = system_message()
        else:
            self._system = config.system

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.config.path)
        self._model = AutoModelForCausalLM.from_pretrained(self.config.path).to(self.config.device)
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

    def propose(self, request: ProposalRequest) -> Proposal:
        import torch

        with self._lock:
            if self._model is None:
                self._load()
            inputs = self._encode(request.prompt)
            sample = self.config.temperature > 0
            gen_kwargs: dict[str, Any] = {"max_new_tokens": self.config.max_new_tokens, "do_sample": sample}
            if sample:
                gen_kwargs["temperature"] = self.config.temperature
            pad = self._tokenizer.pad_token_id
            gen_kwargs["pad_token_id"] = pad if pad is not None else self._tokenizer.eos_token_id
            started = time.monotonic()
            with torch.inference_mode():
                out = self._model.generate(**inputs, **gen_kwargs)
            n_prompt = int(inputs["input_ids"].shape[1])
            new_tokens = out[0, n_prompt:]
            answer = self._tokenizer.decode(new_tokens, skip_special_tokens=True)
        return proposal_from_answer(answer, prompt_tokens=n_prompt, completion_tokens=int(new_tokens.numel()),
                                    meta={"model": self.config.path, "latency_s": round(time.monotonic() - started, 3),
                                          "finish_reason": "length" if new_tokens.numel() >= self.config.max_new_tokens
                                          else "stop"})


# ---------------------------------------------------------------------------------------------
# Replay of generated code


@dataclass(frozen=True, kw_only=True)
class ReplayRow:
    task: str
    answer: str
    code: str | None
    origin: str  # "file.jsonl:LINE" or the .py path
    prompt_tokens: int = 0
    completion_tokens: int = 0


_TASK_HEADER = re.compile(r"^\s*#\s*task:\s*(\S+)\s*$", re.MULTILINE)
_COUNTER_SUFFIX = re.compile(r"(__\d+|\.\d+)$")


def read_replay(path: str | Path) -> list[ReplayRow]:
    """Rows of a replay JSONL file or folder of .py files (see the module docstring for naming)."""
    path = Path(path)
    if path.is_dir():
        return _read_replay_dir(path)
    if path.is_file():
        return _read_replay_jsonl(path)
    raise ProposerError(f"replay: no such file or folder {path}")


def _read_replay_jsonl(path: Path) -> list[ReplayRow]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ProposerError(f"replay: {path}:{n} is not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("task"), str):
            raise ProposerError(f"replay: {path}:{n} needs a string field `task`")
        code, answer = row.get("code"), row.get("answer")
        if not isinstance(code, str) and not isinstance(answer, str):
            raise ProposerError(f"replay: {path}:{n} needs a string field `code` or `answer`")
        if not isinstance(answer, str):
            answer = f"```python\n{code.rstrip()}\n```\n"
        if not isinstance(code, str):
            code = extract_code(answer)
        rows.append(ReplayRow(task=row["task"], answer=answer, code=code, origin=f"{path}:{n}",
                              prompt_tokens=int(row.get("prompt_tokens") or 0),
                              completion_tokens=int(row.get("completion_tokens") or 0)))
    return rows


def _read_replay_dir(root: Path) -> list[ReplayRow]:
    rows = []
    for path in sorted(root.rglob("*.py"), key=lambda p: natural_key(str(p.relative_to(root)))):
        source = path.read_text(errors="replace")
        head = "\n".join(source.splitlines()[:10])
        m = _TASK_HEADER.search(head)
        if m:
            task = m.group(1)
        else:
            task = _COUNTER_SUFFIX.sub("", path.relative_to(root).with_suffix("").as_posix())
        rows.append(ReplayRow(task=task, answer=f"```python\n{source.rstrip()}\n```\n", code=source,
                              origin=str(path)))
    return rows


def _matches(row_task: str, task_name: str) -> bool:
    return row_task == task_name or row_task == task_name.rsplit("/", 1)[-1]


class ReplayProposer(Proposer):
    """Hands out stored programs for a task in order; raises `Exhausted` when none are left."""

    def __init__(self, path: str | Path) -> None:
        self.spec = f"replay:{path}"
        self.rows = read_replay(path)
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def task_names(self) -> list[str]:
        return list(dict.fromkeys(r.task for r in self.rows))

    def _rows_for(self, task_name: str) -> list[ReplayRow]:
        return [r for r in self.rows if _matches(r.task, task_name)]

    def remaining(self, task_name: str) -> int:
        with self._lock:
            return len(self._rows_for(task_name)) - self._next.get(task_name, 0)

    def propose(self, request: ProposalRequest) -> Proposal:
        name = request.task.name
        with self._lock:
            rows = self._rows_for(name)
            i = self._next.get(name, 0)
            if i >= len(rows):
                raise Exhausted(f"replay: no more programs for task {name} ({len(rows)} given)")
            self._next[name] = i + 1
        row = rows[i]
        return Proposal(answer=row.answer, code=row.code, prompt_tokens=row.prompt_tokens,
                        completion_tokens=row.completion_tokens, meta={"origin": row.origin, "index": i})


# ---------------------------------------------------------------------------------------------
# Heuristic rewrites


HEURISTIC_MARKER = "# kernelrl-heuristic:"


@dataclass(frozen=True, kw_only=True)
class Rewrite:
    """A program-level rewrite of the reference; several flags combine into one program."""

    inference_mode: bool = False
    compile_mode: str | None = None  # torch.compile mode: "default", "max-autotune-no-cudagraphs", ...
    compile_freezing: bool = False  # inductor freezing (constant-folds weights; oneDNN on CPU)
    channels_last: bool = False
    jit_freeze: bool = False  # TorchScript trace + freeze + optimize_for_inference (oneDNN fusions)
    cuda_graph: bool = False

    @property
    def name(self) -> str:
        parts = []
        if self.channels_last:
            parts.append("channels_last")
        if self.inference_mode:
            parts.append("inference_mode")
        if self.compile_mode:
            parts.append(f"compile-{self.compile_mode}" + ("-freezing" if self.compile_freezing else ""))
        if self.jit_freeze:
            parts.append("jit_freeze")
        if self.cuda_graph:
            parts.append("cuda_graph")
        return "+".join(parts)

    @property
    def components(self) -> frozenset[str]:
        return frozenset(self.name.split("+"))

    @property
    def compiles(self) -> bool:
        return self.compile_mode is not None


# Ordered cheapest and most widely useful first; the proposer filters by device and task.
CPU_PORTFOLIO: tuple[Rewrite, ...] = (
    Rewrite(inference_mode=True),
    Rewrite(compile_mode="default"),
    Rewrite(inference_mode=True, compile_mode="default"),
    Rewrite(channels_last=True, inference_mode=True),
    Rewrite(jit_freeze=True),
    Rewrite(inference_mode=True, compile_mode="default", compile_freezing=True),
    Rewrite(inference_mode=True, compile_mode="max-autotune-no-cudagraphs"),
    Rewrite(channels_last=True, inference_mode=True, compile_mode="default"),
    Rewrite(channels_last=True, jit_freeze=True),
    Rewrite(channels_last=True, inference_mode=True, compile_mode="default", compile_freezing=True),
)
GPU_PORTFOLIO: tuple[Rewrite, ...] = (
    Rewrite(inference_mode=True),
    Rewrite(compile_mode="default"),
    Rewrite(inference_mode=True, compile_mode="default"),
    Rewrite(inference_mode=True, compile_mode="reduce-overhead"),
    Rewrite(cuda_graph=True),
    Rewrite(channels_last=True, inference_mode=True),
    Rewrite(inference_mode=True, compile_mode="max-autotune-no-cudagraphs"),
    Rewrite(channels_last=True, inference_mode=True, compile_mode="default"),
    Rewrite(channels_last=True, cuda_graph=True),
    Rewrite(inference_mode=True, compile_mode="max-autotune"),
)

_WHY = {
    "inference_mode": "runs the forward pass under torch.inference_mode, so no autograd graph is "
                      "recorded and no version counters are bumped: less per-op overhead",
    "compile": "compiles the forward pass with torch.compile, fusing elementwise chains and "
               "reductions into generated kernels that read and write memory fewer times",
    "freezing": "freezes the weights into the compiled graph, so constant folding and oneDNN "
                "weight prepacking happen once instead of every call",
    "channels_last": "keeps convolution weights and activations in channels_last (NHWC) layout, "
                     "which the convolution kernels read contiguously",
    "jit_freeze": "traces and freezes the module with TorchScript and applies optimize_for_inference, "
                  "which folds batch-free constants and fuses conv/linear with their activations (oneDNN)",
    "cuda_graph": "captures the whole forward pass in a CUDA graph and replays it, removing the "
                  "per-kernel launch overhead that dominates small problems",
}


@dataclass(frozen=True, kw_only=True)
class TaskTraits:
    """What the portfolio needs to know about a reference program."""

    conv2d: bool = False
    conv3d: bool = False
    training_dependent: bool = True  # behaves differently under .eval() (batch norm, dropout)
    tensor_inputs_only: bool = False

    @property
    def conv(self) -> bool:
        return self.conv2d or self.conv3d


def task_traits(task: Task) -> TaskTraits:
    """Inspect the reference on the meta device (nothing allocated); fall back to its source text."""
    import torch
    from torch import nn

    src = task.source
    text_train = bool(re.search(r"dropout|batch_?norm|\.training\b|instance_?norm|rrelu", src, re.IGNORECASE))
    try:
        tm = task.instantiate("small")
        with torch.device("meta"):
            model = tm.Model(*tm.get_init_inputs())
            inputs = tm.get_inputs()
        mods = list(model.modules())
        conv2d = any(isinstance(m, nn.Conv2d | nn.ConvTranspose2d) for m in mods)
        conv3d = any(isinstance(m, nn.Conv3d | nn.ConvTranspose3d) for m in mods)
        train_types = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
                       nn.modules.dropout._DropoutNd, nn.RNNBase, nn.MultiheadAttention, nn.RReLU)
        training_dependent = text_train or any(isinstance(m, train_types) for m in mods)
        tensors_only = bool(inputs) and all(isinstance(x, torch.Tensor) for x in inputs)
        return TaskTraits(conv2d=conv2d, conv3d=conv3d, training_dependent=training_dependent,
                          tensor_inputs_only=tensors_only)
    except Exception:  # noqa: BLE001 - a task that fails on meta is judged from its text
        return TaskTraits(conv2d=bool(re.search(r"conv(transpose)?2d", src, re.IGNORECASE)),
                          conv3d=bool(re.search(r"conv(transpose)?3d", src, re.IGNORECASE)),
                          training_dependent=True, tensor_inputs_only=False)


def applicable(rewrite: Rewrite, traits: TaskTraits, device: str) -> bool:
    if rewrite.channels_last and not traits.conv:
        return False
    # Freezing calls .eval() or constant-folds buffers: only sound when eval and train agree.
    if (rewrite.jit_freeze or rewrite.compile_freezing) and traits.training_dependent:
        return False
    if (rewrite.jit_freeze or rewrite.cuda_graph) and not traits.tensor_inputs_only:
        return False
    if rewrite.jit_freeze and device != "cpu":
        return False
    if rewrite.cuda_graph and not device.startswith("cuda"):
        return False
    return True


class _RenameModel(ast.NodeTransformer):
    def __init__(self, new: str) -> None:
        self.new = new

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:  # noqa: N802 - ast API
        if node.name == "Model":
            node.name = self.new
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802 - ast API
        if node.id == "Model":
            node.id = self.new
        return node


def embed_reference(source: str, new_name: str = "_Reference") -> str:
    """The reference program with `Model` renamed and its input factories dropped (the evaluator
    takes inputs and init arguments from the task). Module constants stay: forward may read them."""
    tree = ast.parse(source)
    tree.body = [n for n in tree.body
                 if not (isinstance(n, ast.FunctionDef) and n.name in ("get_inputs", "get_init_inputs"))]
    tree = _RenameModel(new_name).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


def render_rewrite(task: Task, rewrite: Rewrite, traits: TaskTraits | None = None) -> str:
    """A complete program defining ModelNew that applies `rewrite` to the task's reference."""
    traits = traits or task_traits(task)
    fmt = "torch.channels_last_3d" if traits.conv3d and not traits.conv2d else "torch.channels_last"
    ndim = 5 if fmt.endswith("3d") else 4
    init = ["        self.inner = _Reference(*args, **kwargs)"]
    if rewrite.channels_last:
        init.append(f"        self.inner = self.inner.to(memory_format={fmt})")
    if rewrite.compiles:
        opts = ", options={'freezing': True}" if rewrite.compile_freezing else ""
        mode = "" if rewrite.compile_mode == "default" else f", mode={rewrite.compile_mode!r}"
        init.append(f"        self.run = torch.compile(self.inner{mode}{opts})")
    elif rewrite.jit_freeze:
        init.append("        self.inner.eval()  # sound here: this model behaves the same in eval and train mode")
        init.append("        self.frozen = None")
        init.append("        self.frozen_key = None")
    elif rewrite.cuda_graph:
        init += ["        self.graph = None", "        self.graph_key = None",
                 "        self.static_inputs = None", "        self.static_output = None"]
    else:
        init.append("        self.run = self.inner")

    body: list[str] = []
    if rewrite.channels_last:
        body.append(f"        inputs = tuple(x.contiguous(memory_format={fmt}) "
                    f"if isinstance(x, torch.Tensor) and x.dim() == {ndim} else x for x in inputs)")
    if rewrite.jit_freeze:
        call = "self._frozen(inputs)(*inputs)"
    elif rewrite.cuda_graph:
        call = "self._replay(inputs)"
    else:
        call = "self.run(*inputs)"
    if rewrite.inference_mode:
        body += ["        with torch.inference_mode():", f"            out = {call}"]
    else:
        body.append(f"        out = {call}")
    if rewrite.channels_last:
        # Hand back the reference's (contiguous) layout: same values, same strides as Model's.
        body.append("        out = _contiguous(out)")
    body.append("        return out")

    helpers: list[str] = []
    if rewrite.jit_freeze:
        helpers += [
            "",
            "    def _frozen(self, inputs):",
            "        # Traced for this input signature (shapes and dtypes); traced again if it changes.",
            "        key = tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)",
            "        if self.frozen is None or key != self.frozen_key:",
            "            with torch.no_grad():",
            "                traced = torch.jit.trace(self.inner, tuple(inputs), check_trace=False)",
            "                self.frozen = torch.jit.optimize_for_inference(torch.jit.freeze(traced))",
            "            self.frozen_key = key",
            "        return self.frozen",
        ]
    if rewrite.cuda_graph:
        helpers += [
            "",
            "    def _replay(self, inputs):",
            "        key = tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)",
            "        if self.graph is None or key != self.graph_key:",
            "            self._capture(inputs, key)",
            "        for dst, src in zip(self.static_inputs, inputs):",
            "            dst.copy_(src)",
            "        self.graph.replay()",
            "        # The graph's output buffer is overwritten by the next replay: hand back a copy.",
            "        return _clone(self.static_output)",
            "",
            "    def _capture(self, inputs, key):",
            "        self.static_inputs = [x.clone() for x in inputs]",
            "        with torch.no_grad():",
            "            # Warm-up runs do lazy initialisation (library handles, workspaces) before capture.",
            "            for _ in range(3):",
            "                self.inner(*self.static_inputs)",
            "            torch.cuda.synchronize()",
            "            graph = torch.cuda.CUDAGraph()",
            "            with torch.cuda.graph(graph):",
            "                self.static_output = self.inner(*self.static_inputs)",
            "        self.graph = graph",
            "        self.graph_key = key",
        ]
    functions: list[str] = []
    if rewrite.channels_last:
        functions += [
            "def _contiguous(out):",
            "    if isinstance(out, torch.Tensor):",
            "        return out.contiguous()",
            "    if isinstance(out, (tuple, list)):",
            "        return type(out)(_contiguous(o) for o in out)",
            "    return out",
            "",
            "",
        ]
    if rewrite.cuda_graph:
        functions += [
            "def _clone(out):",
            "    if isinstance(out, torch.Tensor):",
            "        return out.clone()",
            "    if isinstance(out, (tuple, list)):",
            "        return type(out)(_clone(o) for o in out)",
            "    return out",
            "",
            "",
        ]
    lines = [
        f"{HEURISTIC_MARKER} {rewrite.name}",
        "import torch",
        "import torch.nn as nn",
        "",
        "# The reference program, renamed; ModelNew applies a program-level rewrite to it.",
        embed_reference(task.source),
        "",
        "",
        *functions,
        "class ModelNew(nn.Module):",
        "    def __init__(self, *args, **kwargs):",
        "        super().__init__()",
        *init,
        "",
        "    def forward(self, *inputs):",
        *body,
        *helpers,
        "",
    ]
    return "\n".join(lines)


def rewrite_analysis(rewrite: Rewrite, parent_name: str | None) -> str:
    reasons = []
    for part in sorted(rewrite.components):
        key = "compile" if part.startswith("compile") else part
        if key in _WHY:
            reasons.append(f"- {_WHY[key]}.")
    if rewrite.compile_freezing:
        reasons.append(f"- {_WHY['freezing']}.")
    base = (f"The parent version applies `{parent_name}`; this one stacks more on it."
            if parent_name else "The reference runs eager PyTorch, one kernel per operator, with autograd "
                                "bookkeeping although only the forward result is used.")
    return (f"## Performance analysis\n\n{base}\nThis version (`{rewrite.name}`):\n" + "\n".join(reasons)
            + "\nThe arithmetic is unchanged, so results match the reference within floating-point tolerance.\n")


_MARKER_LINE = re.compile(rf"^{re.escape(HEURISTIC_MARKER)}[ \t]*(\S+)[ \t]*$", re.MULTILINE)


def heuristic_name(source: str | None) -> str | None:
    """The rewrite a heuristic program applies, read from its marker line."""
    if not source:
        return None
    first = source.lstrip().splitlines()[0] if source.strip() else ""
    return first[len(HEURISTIC_MARKER):].strip() if first.startswith(HEURISTIC_MARKER) else None


@dataclass(frozen=True, kw_only=True)
class HeuristicConfig:
    device: str = "cpu"
    policy: str = "open"

    def __post_init__(self) -> None:
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ProposerError(f"heuristic proposer: unknown device {self.device!r}")
        if self.policy == "strict":
            raise ProposerError("the heuristic proposer writes PyTorch-level rewrites that call a copy of the "
                                "reference; the strict policy needs custom kernels: use policy open")


class HeuristicProposer(Proposer):
    """Each call returns the next untried rewrite for the task (shared by all chains).

    Parent-aware: when the parent is a heuristic program, untried rewrites that contain all of
    the parent's components (stacking on it) come first. Rewrites whose programs appear in the
    request's prompt (their marker line) count as tried, so a resumed run does not repeat the
    versions it shows. Raises `Exhausted` when every applicable rewrite has been handed out.
    """

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config or HeuristicConfig()
        self.spec = "heuristic"
        self._lock = threading.Lock()
        self._tried: dict[str, set[str]] = {}
        self._traits: dict[tuple[str, str], TaskTraits] = {}

    def portfolio(self, task: Task) -> list[Rewrite]:
        traits = self._traits_for(task)
        full = GPU_PORTFOLIO if self.config.device.startswith("cuda") else CPU_PORTFOLIO
        return [r for r in full if applicable(r, traits, self.config.device)]

    def _traits_for(self, task: Task) -> TaskTraits:
        key = (task.name, task.source_hash)
        with self._lock:
            cached = self._traits.get(key)
        if cached is None:
            cached = task_traits(task)
            with self._lock:
                self._traits[key] = cached
        return cached

    def propose(self, request: ProposalRequest) -> Proposal:
        task = request.task
        options = self.portfolio(task)
        parent_name = heuristic_name(request.parent)
        parent_parts = frozenset(parent_name.split("+")) if parent_name else frozenset()
        # Versions shown in the prompt were measured already (e.g. before a resumed run): skip them.
        shown = set(_MARKER_LINE.findall(request.prompt))
        with self._lock:
            tried = self._tried.setdefault(task.name, set())
            tried.update(shown)
            untried = [r for r in options if r.name not in tried and r.name != parent_name]
            if not untried:
                raise Exhausted(f"heuristic: all {len(options)} rewrites for task {task.name} were proposed")
            stacked = [r for r in untried if parent_parts and parent_parts < r.components]
            chosen = (stacked or untried)[0]
            tried.add(chosen.name)
        code = render_rewrite(task, chosen, self._traits_for(task))
        answer = f"{rewrite_analysis(chosen, parent_name if stacked else None)}\n```python\n{code}```\n"
        return Proposal(answer=answer, code=code, meta={"rewrite": chosen.name, "stacked_on": parent_name
                                                        if stacked else None})


# ---------------------------------------------------------------------------------------------
# Specs


_OPENAI_OPTS = {"base_url", "api_key", "temperature", "max_tokens", "max_tokens_field", "concurrency", "timeout_s", "max_retries",
                "backoff_initial_s", "backoff_max_s", "backoff_jitter", "system", "sleep", "rng"}
_HF_OPTS = {"max_new_tokens", "temperature", "device", "system"}
_HEURISTIC_OPTS = {"device", "policy"}


def _check_opts(kind: str, opts: dict[str, Any], allowed: set[str]) -> dict[str, Any]:
    """Options given as None mean "not set" (CLI flags left out); unknown ones are an error."""
    given = {k: v for k, v in opts.items() if v is not None}
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ProposerError(f"{kind} proposer does not take option(s) {', '.join(unknown)}; "
                            f"it takes {', '.join(sorted(allowed))}")
    return given


def make_proposer(spec: str, **opts: Any) -> Proposer:
    """A proposer from `openai:MODEL`, `hf:PATH`, `replay:PATH` or `heuristic` (see module doc).

    Options that do not apply to the chosen kind raise ProposerError, except `policy` and
    `device`, which every kind accepts so a caller can always pass the run's settings.
    """
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "openai":
        o = _check_opts(kind, {k: v for k, v in opts.items() if k not in ("policy", "device")}, _OPENAI_OPTS)
        retry = RetryPolicy(**{name: o.pop(key) for key, name in (
            ("max_retries", "max_retries"), ("backoff_initial_s", "initial_s"), ("backoff_max_s", "max_s"),
            ("backoff_jitter", "jitter")) if key in o})
        sleep, rng = o.pop("sleep", time.sleep), o.pop("rng", None)
        return OpenAIProposer(OpenAIConfig(model=arg.strip(), retry=retry, **o), sleep=sleep, rng=rng)
    if kind == "hf":
        o = _check_opts(kind, {k: v for k, v in opts.items() if k != "policy"}, _HF_OPTS)
        return HFProposer(HFConfig(path=arg.strip(), **o))
    if kind == "replay":
        _check_opts(kind, {k: v for k, v in opts.items() if k not in ("policy", "device")}, set())
        if not arg.strip():
            raise ProposerError("replay proposer needs a path: replay:PATH")
        return ReplayProposer(arg.strip())
    if kind == "heuristic":
        if arg.strip():
            raise ProposerError(f"heuristic proposer takes no argument, got {spec!r}")
        return HeuristicProposer(HeuristicConfig(**_check_opts(kind, opts, _HEURISTIC_OPTS)))
    raise ProposerError(f"unknown proposer {spec!r}; expected openai:MODEL, hf:PATH, replay:PATH or heuristic")
