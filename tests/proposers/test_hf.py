"""A tiny local Hugging Face model, built and tokenised in the test (no hub)."""

from __future__ import annotations

import pytest
import torch

from kernelrl.proposers import ProposerError, make_proposer
from proposer_fixtures import CONV, LINEAR, request

# ---------------------------------------------------------------------------------------------
# hf:PATH


@pytest.fixture(scope="module")
def tiny_hf_model(tmp_path_factory):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-lm")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([LINEAR, CONV, "```python\nclass ModelNew(nn.Module):\n```"], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(path)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=fast.vocab_size, n_positions=512, n_embd=32, n_layer=2, n_head=2,
                        eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def test_hf_proposer_generates_with_a_local_model(tiny_hf_model):
    proposer = make_proposer(f"hf:{tiny_hf_model}", max_new_tokens=12, temperature=0.0)
    p = proposer.propose(request(prompt="class Model: make it faster"))
    assert isinstance(p.answer, str)
    assert p.prompt_tokens > 5 and 1 <= p.completion_tokens <= 12
    assert p.code is None  # random weights write no fenced program
    again = proposer.propose(request(prompt="class Model: make it faster"))
    assert again.answer == p.answer  # greedy decoding is deterministic


def test_hf_proposer_samples_n_answers_in_one_batch(tiny_hf_model):
    proposer = make_proposer(f"hf:{tiny_hf_model}", max_new_tokens=12, temperature=1.0)
    assert proposer.batched
    torch.manual_seed(0)
    many = proposer.propose_many(request(prompt="class Model: make it faster"), 6)
    assert len(many) == 6 and len({p.answer for p in many}) > 1  # six samples, not one six times
    # each counts its own tokens: a sample that ended early is not charged the batch's padding
    assert all(1 <= p.completion_tokens <= 12 and p.prompt_tokens > 5 for p in many)
    for p in many:
        assert p.meta["finish_reason"] == ("length" if p.completion_tokens == 12 else "stop")
    greedy = make_proposer(f"hf:{tiny_hf_model}", max_new_tokens=12, temperature=0.0)
    assert len({p.answer for p in greedy.propose_many(request(prompt="class Model: make it faster"), 3)}) == 1


def test_hf_proposer_uses_the_chat_template(tiny_hf_model, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    path = tmp_path / "chat"
    shutil.copytree(tiny_hf_model, path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[reply]"
    tok.save_pretrained(path)
    proposer = make_proposer(f"hf:{path}", max_new_tokens=4, temperature=0.0, system="SYS")
    plain = make_proposer(f"hf:{tiny_hf_model}", max_new_tokens=4, temperature=0.0, system="SYS")
    with_template = proposer.propose(request(prompt="hello"))
    without = plain.propose(request(prompt="hello"))
    # the template adds role tags, so more prompt tokens reach the model
    assert with_template.prompt_tokens > without.prompt_tokens


def test_hf_proposer_missing_folder_is_a_clear_error(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(ProposerError, match="no model folder"):
        make_proposer(f"hf:{tmp_path / 'nope'}")
