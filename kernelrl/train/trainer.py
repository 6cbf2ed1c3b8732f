"""kernelrl's GRPO trainer: TRL's `GRPOTrainer`, with the rows that train on nothing taken out.

TRL treats a row every reward function returned None for as unscorable: it leaves it out of its
group's mean and spread and gives it zero advantage. The row still goes through the policy's
forward and backward passes, and its tokens still count in the loss's normaliser (`dapo`, `bnpo`,
`cispo`: the masked tokens of the batch), so the loss of a step shrinks by the share of such rows
(about a half under GRPO-RoC with `keep = 0.5`, which drops that many on purpose), and the 7B
config's 112 dropped rollouts a step cost a full forward and backward each for nothing.

`KernelGRPOTrainer` keeps TRL's generation, rewards, advantages and loss, and after TRL has scored
a generation batch (`_generate_and_score_completions`) takes those rows out of this process's
batch (`drop_rows`): the rows kept come first, and the batch is cut to the smallest size TRL can
still split into `steps_per_generation` equal micro-batches and that every process can share
(TRL gathers per-row metrics across processes, which needs equal sizes: every process keeps as
many rows as the one that trains on most, `batch_rows`); the rows that make it up (fewer than
`steps_per_generation` plus the difference between processes, which under GRPO-RoC is zero
unless a group is split between processes) have their completion masks zeroed, so they add
nothing to the loss, its gradient or its normaliser, which is recounted (`num_items_in_batch`,
gathered over the processes) from the rows that train. What
trains is then what TRL's own loss gives on a batch of the kept rows alone (checked in
`tests/train/test_trainer.py`, against TRL's loss on a hand-made batch).

Which rows: those TRL itself marks unscorable (every reward function returned None: a verdict
with no reward, a rollout GRPO-RoC dropped, a multi-turn turn whose episode has a later turn with
no reward), read from TRL's own reward tensor (`_calculate_rewards`).

Does not change TRL's loss types: the row-counting ones (`grpo`, `sapo`, `dr_grpo`, `luspo`)
would count a zero-masked filler row in a micro-batch's mean, so GRPO-RoC is refused with them at
configuration (`kernelrl.train.grpo.GRPOStageConfig`). Evaluation batches are left as TRL makes
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# TRL loss types that average over rows (a zero-masked row would count in the mean).
ROW_MEAN_LOSSES = frozenset({"grpo", "sapo", "dr_grpo", "luspo"})


def batch_rows(kept: int, *, steps: int, rows: int) -> int:
    """The rows a process's batch keeps when the process that keeps most keeps `kept`: a multiple of
    `steps` (TRL splits the batch into that many equal micro-batches), at least `steps`, at most
    the `rows` it has. Every process keeps as many (TRL gathers per-row metrics across processes,
    which needs equal sizes)."""
    return min(rows, max(steps, math.ceil(kept / steps) * steps))


def drop_rows(batch: Mapping[str, Any], trains: torch.Tensor, *, size: int,
              gather_sum: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    """`batch` (TRL's scored generation batch of this process: every tensor or list of its rows
    along the first dimension) with the rows that train (`trains`, a bool per row) first and the
    others gone, `size` rows in all (`batch_rows`), the rows beyond those that train filled in
    with their masks zeroed; `num_items_in_batch` recounted from the rows that train (`gather_sum`
    sums a count over the processes)."""
    import torch

    n = int(trains.shape[0])
    keep = torch.nonzero(trains, as_tuple=True)[0]
    rest = torch.nonzero(~trains, as_tuple=True)[0]
    if not len(keep) <= size <= n:
        raise ValueError(f"{size} rows cannot hold the {len(keep)} that train out of {n}")
    order = torch.cat([keep, rest])[:size]
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            out[name] = value[order.to(value.device)]
        elif isinstance(value, list) and len(value) == n:
            out[name] = [value[i] for i in order.tolist()]
        else:
            out[name] = value
    filler = torch.arange(size) >= len(keep)
    for name in ("completion_mask", "tool_mask"):
        mask = out.get(name)
        if isinstance(mask, torch.Tensor):
            out[name] = mask * (~filler).to(mask.device).unsqueeze(1).to(mask.dtype)
    loss_mask = out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
    out["num_items_in_batch"] = gather_sum(loss_mask.sum())
    return out


def grpo_trainer_class() -> type:
    """`KernelGRPOTrainer` (TRL imported when asked for)."""
    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    class KernelGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer; rows that train on nothing leave the batch (see the module docstring)."""

        _unscored: torch.Tensor | None = None

        def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._unscored = torch.isnan(rewards).all(dim=1)
            self._local_rows = len(prompts)
            return rewards

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            self._unscored = None
            out = super()._generate_and_score_completions(inputs)
            if self.model is None or not self.model.training or self._unscored is None:
                return out
            n = self._local_rows
            index = self.accelerator.process_index
            trains = ~self._unscored[index * n:(index + 1) * n].cpu()
            self.dropped_rows = int((~trains).sum())
            # every process keeps as many rows as the one that trains on most (see batch_rows)
            device = out["completion_mask"].device
            most = int(self.accelerator.gather(trains.sum().reshape(1).to(device)).max())
            size = batch_rows(most, steps=self.args.steps_per_generation, rows=n)
            if size == n:
                return out

            def gather_sum(count: torch.Tensor) -> torch.Tensor:
                return self.accelerator.gather(count.reshape(1)).sum()

            return drop_rows(out, trains, size=size, gather_sum=gather_sum)

    return KernelGRPOTrainer
