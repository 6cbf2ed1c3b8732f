"""Rows that train on nothing leave the batch: what trains is TRL's own loss on the kept rows alone.

A hand-made generation batch of four rows, two of them unscored (dropped by GRPO-RoC, or no
reward): TRL's `_compute_loss` on a batch of the two kept rows, built by hand, is the reference;
the batch as `drop_rows` leaves it gives the same loss and the same gradients, with the dropped
rows gone (or, where micro-batches must stay equal, one filler row whose mask is zero). The batch
as TRL leaves it without `drop_rows` gives half that loss: the dropped rows' tokens count in its
normaliser."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelrl.train.trainer import batch_rows, drop_rows, grpo_trainer_class


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig

    from kernelrl.tasks.task import Task
    from kernelrl.train.tiny import build_tiny_model

    folder: Path = tmp_path_factory.mktemp("trainer")
    task = Task(name="toy/relu", source="import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                                        "        return torch.relu(x)\n", level=1)
    base = build_tiny_model(folder / "base", [task])
    args = GRPOConfig(output_dir=str(folder / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=6, loss_type="dapo", beta=0.0, report_to="none", use_cpu=True,
                      bf16=False, max_steps=1, logging_steps=1)
    cls = grpo_trainer_class()
    t = cls(model=AutoModelForCausalLM.from_pretrained(base), reward_funcs=[lambda completions, **kw: [0.0] *
                                                                           len(completions)],
            args=args, train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
            processing_class=AutoTokenizer.from_pretrained(base))
    t.current_gradient_accumulation_steps = 1
    return t


def batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    completion_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    return {"prompt_ids": torch.randint(3, vocab, (4, 5), generator=g), "prompt_mask": torch.ones(4, 5, dtype=torch.long),
            "completion_ids": torch.randint(3, vocab, (4, 6), generator=g), "completion_mask": completion_mask,
            "advantages": torch.tensor([1.0, 0.0, -1.0, 0.0]),
            "num_items_in_batch": completion_mask.sum()}


def loss_and_grads(trainer, inputs: dict[str, torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
    return float(loss), grads


def kept_by_hand(full: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    out = {k: v[rows] for k, v in full.items() if k != "num_items_in_batch"}
    out["num_items_in_batch"] = out["completion_mask"].sum()
    return out


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_the_kept_rows_train_as_a_batch_of_them_alone(trainer, steps: int):
    trainer.model.train()
    full = batch(len(trainer.processing_class))
    trains = torch.tensor([True, False, True, False])
    size = batch_rows(2, steps=steps, rows=4)
    assert size == {1: 2, 2: 2, 3: 3}[steps]  # the kept rows, then fillers up to a multiple of the micro-batches
    dropped = drop_rows(full, trains, size=size, gather_sum=lambda count: count)
    assert dropped["completion_ids"].shape[0] == size
    assert torch.equal(dropped["completion_ids"][:2], full["completion_ids"][[0, 2]])
    assert int(dropped["completion_mask"][2:].sum()) == 0  # a filler row adds nothing
    assert int(dropped["num_items_in_batch"]) == int(full["completion_mask"][[0, 2]].sum())
    reference, ref_grads = loss_and_grads(trainer, kept_by_hand(full, [0, 2]))
    loss, grads = loss_and_grads(trainer, dropped)
    assert loss == pytest.approx(reference, rel=1e-5) and reference != 0.0
    assert len(grads) == len(ref_grads) and all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads, ref_grads))


def test_left_in_the_batch_the_dropped_rows_dilute_the_loss(trainer):
    """What TRL does with unscored rows on its own: zero advantage, but their tokens in the normaliser."""
    trainer.model.train()
    full = batch(len(trainer.processing_class))
    reference, _ = loss_and_grads(trainer, kept_by_hand(full, [0, 2]))
    diluted, _ = loss_and_grads(trainer, full)
    kept_tokens = int(full["completion_mask"][[0, 2]].sum())
    assert diluted == pytest.approx(reference * kept_tokens / int(full["completion_mask"].sum()), rel=1e-5)


def test_a_batch_with_every_row_kept_is_left_as_it_is(trainer):
    full = batch(len(trainer.processing_class))
    out = drop_rows(full, torch.ones(4, dtype=torch.bool), size=4, gather_sum=lambda count: count)
    assert all(torch.equal(out[k], full[k]) for k in full)


def test_every_process_keeps_as_many_rows_as_the_one_that_trains_on_most():
    """Two processes of 8 rows, 3 and 5 rows that train, 2 micro-batches: both keep 6 (TRL gathers
    per-row metrics across processes); the first fills 3 rows with zero masks, the second 1."""
    assert batch_rows(5, steps=2, rows=8) == 6 and batch_rows(0, steps=2, rows=8) == 2
    assert batch_rows(8, steps=4, rows=8) == 8


def test_grpo_roc_with_a_row_averaged_loss_is_refused():
    from kernelrl.train.grpo import GRPOStageConfig
    from kernelrl.train.roc import RoCConfig

    with pytest.raises(ValueError, match="token-normalised grpo.trl.loss_type"):
        GRPOStageConfig(roc=RoCConfig(enabled=True), trl={"max_steps": 1, "num_generations": 8, "loss_type": "grpo"})
    GRPOStageConfig(roc=RoCConfig(enabled=True), trl={"max_steps": 1, "num_generations": 8, "loss_type": "bnpo"})
