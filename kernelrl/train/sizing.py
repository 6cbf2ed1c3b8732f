"""What a stage will need, sized before it starts: optimizer steps, checkpoint disk, token context.

The dry run (`kernelrl.train.launch`) reads these; each is a plain function of the run config and
what is on disk:

- `rft_rounds`: each rejection-sampling round fine-tunes on every row kept so far (and the SFT set
  when `include_sft_set`), so round r holds at most the SFT rows plus r x tasks x
  `samples_per_task`; its optimizer steps follow from that (`optimizer_steps`), counted over the
  training tasks the suite holds, not over the suites named;
- `model_parameters`: the model's parameter count, read from a model folder's safetensors headers
  (exact), else estimated from a hub id's name ("7B": about 7e9), else unknown;
- `checkpoint_bytes`: one checkpoint as the Trainer writes it: the trained weights (all of them in
  the model's dtype, or a LoRA adapter in float32) and AdamW's state for the trainable parameters
  (two float32 moments; three float32 copies under DeepSpeed, which keeps float32 master weights),
  times the checkpoints kept at once (`save_total_limit` + 1: the Trainer writes the newest before
  it deletes the oldest);
- `generation_context`: the most tokens the policy generates in: `grpo.context_tokens` (a vLLM
  server's `--max-model-len`), `grpo.trl.vllm_max_model_length`, or a model folder's
  `max_position_embeddings`.

Does not measure: a LoRA adapter's size needs the model's config (a model folder); a hub id is
not fetched, so its size is an estimate from its name and its config is not read.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelrl.train.recipe import TrainConfig
    from kernelrl.train.stage import Stage

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
_SAFETENSOR_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                     "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def optimizer_steps(trl: dict[str, Any], *, examples: int, processes: int) -> int:
    """Optimizer steps of an SFT-style run: `max_steps` when set, else the epochs over `examples`
    rows at per_device_train_batch_size x processes x gradient_accumulation_steps a step (the
    Trainer's own count, a partial last step included)."""
    if int(trl.get("max_steps", -1) or -1) > 0:
        return int(trl["max_steps"])
    per_step = (int(trl.get("per_device_train_batch_size", 8)) * max(1, processes)
                * int(trl.get("gradient_accumulation_steps", 1)))
    epochs = float(trl.get("num_train_epochs", 3.0))
    return max(1, math.ceil(math.ceil(examples / per_step) * epochs)) if examples else 0


def warmup_steps(trl: dict[str, Any], steps: int) -> int:
    """Warmup in optimizer steps: `warmup_steps` (TRL/transformers read a value below 1 as a ratio),
    else `warmup_ratio` of the run."""
    w = trl.get("warmup_steps")
    if w is not None and float(w) >= 1:
        return int(w)
    ratio = float(w) if w is not None else float(trl.get("warmup_ratio", 0.0) or 0.0)
    return math.ceil(ratio * steps)


@dataclass(frozen=True, kw_only=True)
class Round:
    """One RFT round's most rows (every sample kept) and the optimizer steps they make."""

    round: int
    sft_rows: int
    samples: int  # rounds 1..r, every sample kept
    steps: int
    warmup: int

    @property
    def rows(self) -> int:
        return self.sft_rows + self.samples


def rft_rounds(config: TrainConfig, *, tasks: int, sft_rows: int, processes: int) -> list[Round]:
    """Each round's most rows and steps (see the module docstring)."""
    rft = config.rft
    out = []
    for r in range(1, rft.rounds + 1):
        samples = r * tasks * rft.samples_per_task
        steps = optimizer_steps(rft.trl, examples=sft_rows + samples, processes=processes)
        out.append(Round(round=r, sft_rows=sft_rows, samples=samples, steps=steps,
                         warmup=warmup_steps(rft.trl, steps)))
    return out


def rows_for_steps(trl: dict[str, Any], steps: int, *, processes: int) -> int:
    """The fewest rows whose fine-tune has more than `steps` optimizer steps (without max_steps)."""
    per_step = (int(trl.get("per_device_train_batch_size", 8)) * max(1, processes)
                * int(trl.get("gradient_accumulation_steps", 1)))
    epochs = float(trl.get("num_train_epochs", 3.0))
    batches = math.floor(steps / epochs) + 1
    return (batches - 1) * per_step + 1


def _safetensors_parameters(path: Path) -> int:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(min(size, 100 << 20)))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


def model_parameters(path: str) -> tuple[int | None, str]:
    """The model's parameter count and how it is known (see the module docstring)."""
    folder = Path(path)
    if folder.is_dir():
        files = sorted(folder.glob("*.safetensors"))
        if files:
            try:
                return sum(_safetensors_parameters(f) for f in files), f"counted in {len(files)} safetensors file(s)"
            except (OSError, ValueError, KeyError, struct.error):
                pass
        return None, "its weights are not safetensors files"
    m = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)\s*[bB](?![A-Za-z])", path)
    if m:
        return int(float(m.group(1)) * 1e9), f"about {m.group(1)}B, read from the hub id's name"
    return None, "a hub id whose name gives no size"


def lora_parameters(path: str, r: int) -> int | None:
    """The parameters of LoRA adapters of rank `r` on every linear layer of a decoder whose config
    is in the model folder `path` (attention q, k, v, o and the MLP's gate, up, down), or None."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
        hidden, inter, layers = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    head_dim = hidden // heads
    per_layer = ((hidden + hidden) * 2 + (hidden + kv * head_dim) * 2  # q, o; k, v
                 + (hidden + inter) * 3)  # gate, up, down
    return r * per_layer * layers


@dataclass(frozen=True, kw_only=True)
class CheckpointSize:
    each: int  # bytes of one checkpoint
    kept: int  # checkpoints on disk at once
    how: str

    @property
    def total(self) -> int:
        return self.each * self.kept


def checkpoint_bytes(config: TrainConfig, stage: Stage, trl: dict[str, Any], *, deepspeed: bool
                     ) -> CheckpointSize | str:
    """What the stage's checkpoints take on disk, or why it cannot be told."""
    params, how = model_parameters(config.model.path)
    if params is None:
        return f"model size unknown ({how})"
    weight_bytes = DTYPE_BYTES.get(config.model.dtype, 2)
    lora = config.model.lora
    if lora is not None:
        adapter = lora_parameters(config.model.path, lora.r)
        if adapter is None:
            return f"the LoRA adapter's size needs the model's config ({config.model.path} is not a model folder)"
        trainable, weights = adapter, adapter * 4
        how += f"; LoRA r={lora.r}: {adapter / 1e6:.0f}M trainable"
    else:
        trainable, weights = params, params * weight_bytes
    optimizer = trainable * (12 if deepspeed else 8)
    limit = trl.get("save_total_limit")
    steps = int(trl.get("max_steps", -1) or -1)
    every = int(trl.get("save_steps", 500) or 500)
    if limit:
        kept = int(limit) + 1
    elif steps > 0:
        kept = max(1, steps // every)
    else:
        kept = 1
    return CheckpointSize(each=weights + optimizer, kept=kept, how=how + (
        f"; weights {weights / 1e9:.1f} GB + optimizer state {optimizer / 1e9:.1f} GB"
        f" ({'float32 master weights and two moments' if deepspeed else 'two float32 moments'})"))


def free_bytes(folder: Path) -> tuple[int, Path]:
    """Free space where `folder` is (or would be made), and the existing folder measured."""
    import shutil

    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
    return shutil.disk_usage(existing).free, existing


def generation_context(config: TrainConfig) -> tuple[int | None, str]:
    """The most tokens the policy generates in, and where that number comes from."""
    grpo = config.grpo
    if grpo.context_tokens is not None:
        return grpo.context_tokens, "grpo.context_tokens"
    vllm = grpo.trl.get("vllm_max_model_length")
    if isinstance(vllm, int):
        return vllm, "grpo.trl.vllm_max_model_length"
    try:
        cfg = json.loads((Path(config.model.path) / "config.json").read_text())
        return int(cfg["max_position_embeddings"]), f"{config.model.path}'s max_position_embeddings"
    except (OSError, ValueError, KeyError, TypeError):
        return None, "unknown: set grpo.context_tokens (a vLLM server's --max-model-len)"


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB"
