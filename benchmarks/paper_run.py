"""A 7B run on 8 H100s, on paper: the cost of each stage of `qwen7b-full-8gpu-vllm`.

Prints the tables of `kernelrl/configs/train/paper-run.md` from three inputs, and nothing else:
- the shipped run config (steps, batch sizes, processes, lengths, tasks of the train split);
- this evaluator's measured cost per candidate (benchmarks/README.md, "Throughput", 2026-11-24,
  `python3 -u benchmarks/eval_throughput.py --only both`, 2-core CPU machine);
- vLLM's output throughput for an 8B model on one H100 (LambdaLabsML/vllm-benchmark,
  benchmark_v0.md: Llama 3.1 8B, tp=1, max-seq-len 2048, 256 sequences at once).

`python3 benchmarks/paper_run.py` prints the markdown; `tests/train/test_configs.py` checks that
paper-run.md holds exactly what it prints, so the document and the configs cannot drift apart.
"""

from __future__ import annotations

import math

from kernelrl.config import config_path
from kernelrl.tasks.splits import for_training
from kernelrl.tasks.suites import load_tasks
from kernelrl.train.recipe import TRAIN_CONFIG_DIR, load_train_config

CONFIG = "qwen7b-full-8gpu-vllm"

# Measured here (benchmarks/README.md, "Throughput"): the GRPO-shaped batch of 32 candidates, batched,
# 252.5 s on 2 cores; its four groups' timing phases 21.8-40.4 s for 8 candidates each.
BATCH_S, BATCH_CANDIDATES, CORES = 252.5, 32, 2
CORE_S_PER_CANDIDATE = BATCH_S * CORES / BATCH_CANDIDATES  # every phase, hangs and cold C++ builds included
LANE_S_PER_CANDIDATE = (21.8 / 8, 40.4 / 8)  # exclusive timing-lane time, CPU timing

# LambdaLabsML/vllm-benchmark, benchmark_v0.md, Llama 3.1 8B on 1x H100-80GB-SXM (tp=1, max-seq-len 2048):
VLLM_TOKENS_PER_S = {"vLLM v0.6.0, 10 scheduler steps": 8088.35, "vLLM v0.5.4": 3032.04}


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def judge_devices() -> int:
    """The judging machine's GPUs, as the config's header names them (`kernelrl serve --devices ...`)."""
    text = config_path(CONFIG, TRAIN_CONFIG_DIR).read_text()
    line = next(x for x in text.splitlines() if "kernelrl serve --devices" in x)
    return len(line.split("--devices", 1)[1].split()[0].split(","))


def table() -> str:
    config = load_train_config(CONFIG)
    tasks, _ = for_training(load_tasks(list(config.tasks)), config.splits)
    n_tasks = len(tasks)
    fast, slow = max(VLLM_TOKENS_PER_S.values()), min(VLLM_TOKENS_PER_S.values())
    lane_lo, lane_hi = LANE_S_PER_CANDIDATE
    judges = judge_devices()

    def judging(n: int) -> str:
        return (f"{n * CORE_S_PER_CANDIDATE:.0f} core-s; {n * lane_lo:.0f}-{n * lane_hi:.0f} lane-s = "
                f"{_h(n * lane_lo / judges)}-{_h(n * lane_hi / judges)} on {judges} GPUs")

    g = config.grpo.trl
    grpo_procs = config.launch.grpo_processes
    per_step = g["per_device_train_batch_size"] * grpo_procs * g["gradient_accumulation_steps"]
    n_gen = g["num_generations"]
    grpo_tokens = per_step * g["max_completion_length"]
    gen_fast, gen_slow = grpo_tokens / fast, grpo_tokens / slow
    pace = (math.ceil(per_step * lane_hi / gen_fast), math.ceil(per_step * lane_hi / gen_slow))
    cores = math.ceil(per_step * CORE_S_PER_CANDIDATE / gen_fast)
    r = config.rft
    rft_samples = n_tasks * r.samples_per_task
    rft_tokens = rft_samples * r.max_new_tokens
    rft_gpus = config.launch.rft_processes
    s = config.sft.trl
    sft_step = s["per_device_train_batch_size"] * s["gradient_accumulation_steps"] * config.launch.sft_processes
    rt = r.trl
    rft_step = rt["per_device_train_batch_size"] * rt["gradient_accumulation_steps"] * rft_gpus
    collect = n_tasks * 20
    keep = round(per_step * config.grpo.roc.keep) if config.grpo.roc.enabled else per_step

    rows = [
        ("collect, per proposer (`--tries 20`)", "-", f"<= {collect} answers ({n_tasks} tasks x 20)",
         "the proposer's", f"<= {judging(collect)}"),
        (f"sft, {config.launch.sft_processes} GPUs", f"{s['num_train_epochs']} x R / {sft_step} for an SFT set of R rows",
         f"{sft_step} rows", "-", "-"),
        (f"rft, {rft_gpus} GPUs, vLLM on each", f"{r.rounds} rounds of K / {rft_step} for K rows kept",
         f"{rft_samples} samples per round ({n_tasks} tasks x {r.samples_per_task})",
         f"<= {_h(rft_tokens / (rft_gpus * fast))}-{_h(rft_tokens / (rft_gpus * slow))} per round",
         f"{judging(rft_samples)} per round"),
        (f"grpo, {grpo_procs} GPUs train, 1 serves vLLM", f"{g['max_steps']}",
         f"{per_step} ({per_step // n_gen} prompts x {n_gen}; {keep} train after RoC)",
         f"<= {_h(gen_fast)}-{_h(gen_slow)} per step; <= {_h(g['max_steps'] * gen_fast)}-"
         f"{_h(g['max_steps'] * gen_slow)} in all", f"{judging(per_step)} per step"),
    ]
    head = "| stage | optimizer steps | rollouts per step | generation (upper bound) | judging |\n|---|---|---|---|---|\n"
    body = "".join("| " + " | ".join(row) + " |\n" for row in rows)
    notes = (
        f"\nInputs: {n_tasks} tasks of the built-in train split; completions of at most {g['max_completion_length']} "
        f"tokens (grpo) and {r.max_new_tokens} (rft), so generation times are upper bounds (every completion at its "
        f"limit: {grpo_tokens / 1e6:.2f}M tokens per grpo step, {rft_tokens / 1e6:.2f}M per rft round); vLLM at "
        f"{slow:.0f}-{fast:.0f} output tokens/s per H100; judging {CORE_S_PER_CANDIDATE:.1f} CPU core-s and "
        f"{lane_lo:.1f}-{lane_hi:.1f} s of exclusive timing lane per candidate; {judges} judging GPUs.\n\n"
        f"GPUs for judging: a grpo step's judging keeps pace with its generation on {pace[0]} GPUs when vLLM runs at "
        f"{fast:.0f} tokens/s and every candidate takes {lane_hi:.1f} s of lane, on {pace[1]} at {slow:.0f} tokens/s; "
        f"the builds and checks need {cores} CPU cores at the faster pace.\n")
    return head + body + notes


if __name__ == "__main__":
    print(table(), end="")
