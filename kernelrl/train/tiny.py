"""A tiny random causal LM for CPU runs and tests: built here, never downloaded.

`build_tiny_model(folder, tasks, config)` writes a Qwen2 model and its tokenizer to `folder`,
loadable with `from_pretrained` like any checkpoint. The tokenizer is a byte-level BPE trained on
the text the model will read (the tasks' prompts, and `corpus`: an SFT set's prompts and answers).
Two uses, chosen by the config:

- smoke runs (`program_variants` > 0, the default): a few thousand parameters, only the bytes the
  prompts use, plus whole programs as single tokens: for each task, `program_variants` tokens
  that each hold one complete answer (a correct program, a wrong one, one that does not parse),
  differing only in a one-line preamble. A random model then writes a complete program in a
  sizeable share of its samples, so a group of samples gets different verdicts, which is what
  GRPO needs to move the weights;
- a policy that writes its own programs (`program_variants = 0`, `byte_alphabet = true`, a few
  million parameters: `tiny-cpu-learn`): every byte is in the vocabulary, so any program can be
  written token by token, and no answer is a token. With `template_lines`, each line that every
  task's first-attempt prompt holds under one policy (the template's instructions) is one token,
  as a tokenizer trained on many such prompts would merge it: prompts shrink to what differs
  between tasks.

Guarantees: the same tasks, corpus and config give the same tokenizer and weights (seeded); the
model ends its answers with its EOS token only by chance until it is trained to.

Does not produce a model that knows anything before training: it is a test device and the
starting point of the CPU recipe, not a baseline.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kernelrl.tasks.source import embed_reference
from kernelrl.tasks.task import Task

EOS = "<|endoftext|>"
UNK = "<unk>"


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    hidden_size: int = 32  # width of the residual stream
    layers: int = 2  # decoder layers
    heads: int = 2  # attention heads per layer (hidden_size must divide among them)
    bpe_vocab: int = 160  # learned tokens (byte alphabet seen in the prompts plus merges)
    program_variants: int = 4  # whole-program tokens per program and task (0: none, answers are written)
    byte_alphabet: bool = False  # every byte a token (any text can be written); else only the prompts' bytes
    template_lines: bool = False  # each line every task's first-attempt prompt holds is one token
    mlp_ratio: int = 2  # the feed-forward layer's width over hidden_size
    max_positions: int = 32768  # the longest sequence, prompt and answer, in tokens
    # Attention over the last `window` tokens in every layer (None: the whole prompt). A model
    # this small, attending over a prompt thousands of tokens long, averages away the few tokens
    # that differ between prompts; with a window it reads the prompt's end, where a refinement
    # turn's history and verdict are.
    window: int | None = None
    seed: int = 0  # the random weights' seed

    def __post_init__(self) -> None:
        if self.hidden_size < 8 or self.hidden_size % self.heads:
            raise ValueError("tiny model: hidden_size must be >= 8 and divisible by heads")
        if self.layers < 1 or self.heads < 1 or self.mlp_ratio < 1:
            raise ValueError("tiny model: layers, heads and mlp_ratio must be >= 1")
        if self.program_variants < 0:
            raise ValueError("tiny model: program_variants must be >= 0 (0: no whole-program tokens)")
        if self.byte_alphabet and self.bpe_vocab < 256 + 32:
            raise ValueError("tiny model: with byte_alphabet, bpe_vocab must be >= 288 (the 256 bytes and merges)")
        if self.bpe_vocab < 32:
            raise ValueError("tiny model: bpe_vocab must be >= 32")
        if self.window is not None and self.window < 1:
            raise ValueError("tiny model: window must be >= 1 token (or None: the whole prompt)")


def seed_programs(task: Task) -> dict[str, str]:
    """Three answers for a task: a correct one (the reference under inference mode), a wrong one
    (its output scaled) and one that does not parse."""
    embedded = embed_reference(task.source)
    wrapper = ("import torch\nimport torch.nn as nn\n\n{ref}\n\n\nclass ModelNew(nn.Module):\n"
               "    def __init__(self, *args, **kwargs):\n        super().__init__()\n"
               "        self.inner = _Reference(*args, **kwargs)\n\n    def forward(self, *inputs):\n"
               "        with torch.inference_mode():\n            return {ret}\n")
    return {
        "correct": wrapper.format(ref=embedded, ret="self.inner(*inputs)"),
        "wrong": wrapper.format(ref=embedded, ret="self.inner(*inputs) * 1.5"),
        "broken": "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x:\n        return x\n",
    }


def program_tokens(tasks: Sequence[Task], variants: int,
                   programs: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """The whole-answer tokens: each starts and ends a line, so its fences stand on lines of their own.

    `programs` (task name -> kind -> code) replaces `seed_programs` for the tasks it names; an
    empty code is an answer with no code block at all."""
    out = []
    for task in tasks:
        menu = programs[task.name] if programs is not None and task.name in programs else seed_programs(task)
        for kind, code in menu.items():
            for v in range(variants):
                body = f"```python\n{code}```\n" if code else "No code this time.\n"
                out.append(f"\nPlan {v}: {kind} version for {task.name}.\n{body}")
    return out


def template_lines(prompts: Sequence[str], *, min_chars: int = 12) -> list[str]:
    """The lines (with their newline) that every prompt holds: the template's own text, the same
    whatever the task (none from fewer than two prompts: one prompt's lines are its task's too).
    Short lines stay BPE text (a line like ````python` is also program text)."""
    if len(prompts) < 2:
        return []
    common = set(prompts[0].splitlines(keepends=True))
    for p in prompts[1:]:
        common &= set(p.splitlines(keepends=True))
    return sorted((line for line in common if len(line.strip()) >= min_chars), key=lambda x: (-len(x), x))


def build_tiny_model(folder: str | Path, tasks: Sequence[Task], config: TinyModelConfig | None = None, *,
                     corpus: Sequence[str] = (), programs: Mapping[str, Mapping[str, str]] | None = None,
                     phrases: Sequence[str] = ()) -> Path:
    """Write a tiny Qwen2 model and its tokenizer to `folder` (see the module docstring).

    `corpus` is extra text the tokenizer should cover (the prompts are built here from the tasks);
    `programs` gives tasks whole-answer tokens of the caller's choosing (`program_tokens`);
    `phrases` are strings the tokenizer keeps whole, one token each (lines the prompts repeat, as a
    tokenizer trained on many such prompts would merge them).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from kernelrl.episodes.prompt import build_prompt, system_message

    config = config or TinyModelConfig()
    folder = Path(folder)
    texts = [system_message(), *corpus]
    first_prompts: dict[str, list[str]] = {}  # policy -> each task's first-attempt prompt
    for task in tasks:
        texts.append(task.source)
        for policy in ("open", "strict", "strict-pytorch"):
            texts.append(build_prompt(task, db=None, chain_best=None, policy=policy, device="cpu",
                                      rng=random.Random(0), size="small"))
            first_prompts.setdefault(policy, []).append(texts[-1])
    bpe = Tokenizer(models.BPE(unk_token=UNK))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    # Without the full byte alphabet only the characters the prompts use are tokens, so the
    # vocabulary stays small and the whole-program tokens are a sizeable share of it; a policy
    # that writes its own programs needs every byte (`!`, `{` and `}` are in programs, not prompts).
    alphabet = pre_tokenizers.ByteLevel.alphabet() if config.byte_alphabet else []
    bpe.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=config.bpe_vocab, initial_alphabet=alphabet,
                                                               special_tokens=[UNK, EOS], show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token=UNK, eos_token=EOS,  # type: ignore[no-untyped-call]
                                        pad_token=EOS, padding_side="left")
    if config.program_variants:
        tokenizer.add_tokens(program_tokens(tasks, config.program_variants, programs))
    template = [line for prompts in first_prompts.values() for line in template_lines(prompts)]
    lines = [*phrases, *(template if config.template_lines else ())]
    if lines:
        tokenizer.add_tokens(list(dict.fromkeys(lines)))
    torch.manual_seed(config.seed)
    model_config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=config.hidden_size,
                               intermediate_size=config.mlp_ratio * config.hidden_size, num_hidden_layers=config.layers,
                               num_attention_heads=config.heads, num_key_value_heads=config.heads,
                               max_position_embeddings=config.max_positions, tie_word_embeddings=True,
                               eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id,
                               use_sliding_window=config.window is not None, sliding_window=config.window,
                               max_window_layers=0)  # with a window: every layer slides
    model = Qwen2ForCausalLM(model_config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
