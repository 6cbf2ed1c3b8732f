"""Loading a causal LM from a folder (built and tokenised here, no hub), chat formats, sampling,
and one SFT pass with LoRA merged on save."""

from __future__ import annotations

import pytest
import torch

from kernelrl.tasks.task import Task
from kernelrl.train.model import (
    LoraSettings,
    ModelConfig,
    as_completion,
    as_prompt,
    completion_text,
    is_model_folder,
    load_model,
    peft_config,
    prompt_text,
    sample_answers,
)
from kernelrl.train.sft import finetune
from kernelrl.train.sft_set import SFTRow
from kernelrl.train.tiny import TinyModelConfig, build_tiny_model, seed_programs

TASK = Task(name="toy/scale", source=(
    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
    "        return x * 2.0\n\nn = 64\n\ndef get_inputs():\n    return [torch.randn(n, n)]\n\n"
    "def get_init_inputs():\n    return []\n"), level=1)
CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}" \
       "<assistant>{% endif %}"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A Qwen2 config and a BPE tokenizer with a chat template, built here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = tmp_path_factory.mktemp("chat-lm")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([TASK.source, CHAT, "```python\nclass ModelNew(nn.Module):\n```"],
                            trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", eos_token="<eos>")
    tok.chat_template = CHAT
    tok.save_pretrained(path)
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                                 eos_token_id=tok.eos_token_id)).save_pretrained(path)
    return path


def test_load_from_a_folder_gives_a_left_padding_tokenizer_with_a_pad_token(chat_model):
    model, tok = load_model(chat_model, ModelConfig(path=str(chat_model)))
    assert is_model_folder(chat_model) and tok.pad_token is not None and tok.padding_side == "left"
    assert model.config.num_hidden_layers == 1
    messages = as_prompt(tok, "make it faster", "SYS")
    assert messages == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "make it faster"}]
    assert as_completion(tok, "ans") == [{"role": "assistant", "content": "ans"}]
    assert prompt_text(messages) == "make it faster" and completion_text(as_completion(tok, "ans")) == "ans"


def test_sampling_n_answers_per_prompt(chat_model):
    model, tok = load_model(chat_model, ModelConfig(path=str(chat_model)))
    out = sample_answers(model, tok, [as_prompt(tok, "a", ""), as_prompt(tok, "b b b", "")], n=3, max_new_tokens=5,
                         temperature=1.0)
    assert [len(s) for s in out] == [3, 3]
    assert all(1 <= s.completion_tokens <= 5 and s.prompt_tokens > 2 for per in out for s in per)
    greedy = sample_answers(model, tok, ["plain text prompt"], n=2, max_new_tokens=4, temperature=0.0)
    assert greedy[0][0].text == greedy[0][1].text


def test_tiny_model_holds_whole_programs_as_tokens(tmp_path):
    line = "Turn 1 failed (incorrect): fix what its verdict says first.\n"
    path = build_tiny_model(tmp_path / "tiny", [TASK], TinyModelConfig(program_variants=2), phrases=[line])
    model, tok = load_model(path, ModelConfig(path=str(path)))
    assert tok.chat_template is None and as_prompt(tok, "p", "S") == "S\n\np"
    assert tok.convert_ids_to_tokens(tok("x\n" + line)["input_ids"])[-1] == line  # a phrase is one token
    programs = seed_programs(TASK)
    ids = tok("x" + f"\nPlan 1: correct version for {TASK.name}.\n```python\n{programs['correct']}```\n")["input_ids"]
    assert len(ids) == 2  # one character, one program
    assert len(tok) < 250 and sum(p.numel() for p in model.parameters()) < 100_000


def test_a_windowed_tiny_model_reads_the_end_of_its_prompt_and_nothing_before(tmp_path):
    window, layers = 16, 2
    path = build_tiny_model(tmp_path / "tiny", [TASK], TinyModelConfig(window=window, layers=layers))
    model, tok = load_model(path, ModelConfig(path=str(path)))  # the window survives saving and loading
    ids = tok(TASK.source * 3, return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 4 * layers * window

    def last(changed_at: int) -> torch.Tensor:
        x = ids.clone()
        x[0, changed_at] = (x[0, changed_at] + 1) % len(tok)
        with torch.no_grad():
            return model(x).logits[0, -1]

    with torch.no_grad():
        base = model(ids).logits[0, -1]
    n = ids.shape[1]
    # each layer looks `window` tokens back: beyond layers * window the last position sees nothing
    assert torch.equal(last(n - layers * window - 2), base)
    assert torch.equal(last(0), base)
    assert not torch.allclose(last(n - 3), base)


def test_one_sft_pass_with_lora_merged_on_save(chat_model, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = ModelConfig(path=str(chat_model), lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    assert peft_config(cfg).r == 4 and peft_config(ModelConfig(path="x")) is None
    rows = [SFTRow(task=TASK.name, prompt="make it faster", answer="```python\nclass ModelNew: pass\n```",
                   verdict="correct", speedup=1.2, proposer="test")] * 4
    trl = {"max_steps": 3, "per_device_train_batch_size": 2, "learning_rate": 5e-2, "report_to": "none",
           "use_cpu": True, "bf16": False, "save_strategy": "no", "logging_steps": 1}
    outcome = finetune(rows, source=str(chat_model), model=cfg, trl=trl, output_dir=tmp_path / "sft")
    assert outcome.steps == 3 and outcome.parameters_changed
    assert not (outcome.final_dir / "adapter_config.json").exists()  # a plain, merged model
    assert (outcome.final_dir / "adapter" / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(chat_model)
    tuned = AutoModelForCausalLM.from_pretrained(outcome.final_dir)
    diffs = [(a - b).abs().max().item() for a, b in zip(base.state_dict().values(), tuned.state_dict().values())]
    assert max(diffs) > 0


TASK_B = Task(name="toy/shift", source=TASK.source.replace("x * 2.0", "x + 1.0"), level=1)


def test_a_writing_tiny_model_can_write_any_byte_and_holds_no_program_token(tmp_path):
    answer = "```python\nif a != b:\n    opts = {'freezing': True}\n```\n"
    config = TinyModelConfig(hidden_size=64, layers=2, heads=4, bpe_vocab=400, program_variants=0, byte_alphabet=True,
                             template_lines=True, mlp_ratio=4)
    path = build_tiny_model(tmp_path / "tiny", [TASK, TASK_B], config, corpus=[answer])
    model, tok = load_model(path, ModelConfig(path=str(path)))
    for text in (answer, "~`^|\\ é 中", "".join(map(chr, range(32, 127)))):
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == text  # written token by token, exactly
    # no answer is a token: a program takes many (the smoke model's whole-program tokens are absent)
    assert len(tok(f"```python\n{seed_programs(TASK)['correct']}```\n")["input_ids"]) > 50
    # a line every task's first-attempt prompt holds is one token; a line of one task's source is not
    from kernelrl.episodes.prompt import first_attempt_prompt

    prompt = first_attempt_prompt(TASK, policy="strict-pytorch", device="cpu")
    template = "- Do not read environment variables or files, and do not open sockets or subprocesses.\n"
    assert template in prompt and template in tok.convert_ids_to_tokens(tok(prompt)["input_ids"])
    assert "        return x * 2.0\n" not in tok.get_vocab()
    # a few hundred thousand parameters here; the recipe's config builds millions (its own test)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000


def test_a_single_prompt_has_no_template_lines():
    from kernelrl.train.tiny import template_lines

    assert template_lines(["a long line of the prompt\nanother long line\n"]) == []
    assert template_lines(["shared line of text here\nonly in one\n", "shared line of text here\nother\n"]) == [
        "shared line of text here\n"]
