"""What the reward's clip leaves of speed: fast, slow, copy and failure advantages in one group.

A shipped training config's reward (`--config`, default the 7B LoRA config), its clip window
converged (64 earlier correct results all at the fast answer's raw reward: sigma 0), then one
GRPO group of 16 rollouts: 10 fast (2x), 3 slow (1.0x), 2 copies of the shown version (measured
2x, paid at most as no speedup) and 1 failure (does not build). Each rollout's raw reward, what
the clip pays and its advantage as TRL computes it with `scale_rewards = "group"` ((r - mean) /
(std + 1e-4), std with Bessel's correction), and the share the issue asks about: the fast-slow
advantage gap over the slow-failure gap.

    python benchmarks/clip_advantages.py                                # this checkout
    python benchmarks/clip_advantages.py --kernelrl-root /path/to/older/checkout   # another's code

The answer text is a well-formed answer (the config's format term paid) of 1000 tokens (under
the length term's soft limit). Prints a table and one last line with the share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

GROUP = (("fast", 2.0, 10), ("slow", 1.0, 3), ("copy", 2.0, 2), ("failure", None, 1))
ANSWER = "Analysis.\n\n```python\nclass ModelNew:\n    pass\n```\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="qwen7b-lora-1gpu", help="a training config whose [reward] is used")
    ap.add_argument("--kernelrl-root", type=Path, default=Path(__file__).resolve().parents[1],
                    help="import kernelrl from this checkout")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.kernelrl_root.resolve()))
    from kernelrl.result import EvalResult, Status
    from kernelrl.reward import Reward, RewardModel
    from kernelrl.train.recipe import load_train_config

    model = RewardModel(load_train_config(args.config).reward)

    def raw(kind: str, speedup: float | None) -> Reward:
        if speedup is None:
            result = EvalResult(task="t", status=Status.COMPILE_ERROR)
        else:
            result = EvalResult(task="t", status=Status.CORRECT, speedup=speedup,
                                speedup_ci=(speedup * 0.97, speedup * 1.03), noise_band=(0.97, 1.03))
        reward = model.raw(result, answer=ANSWER, completion_tokens=1000, copy=kind == "copy")
        assert reward is not None
        return reward

    fast = raw("fast", 2.0)
    model.load_state({"tasks": {"t": [fast.raw] * 64}, "levels": []})
    batch = [(kind, raw(kind, s)) for kind, s, n in GROUP for _ in range(n)]
    paid = [p for p in model.clip_batch([(r, "t", None) for _, r in batch]) if p is not None]
    values = [r.value for r in paid]
    mean, std = statistics.fmean(values), statistics.stdev(values)
    adv = [(v - mean) / (std + 1e-4) for v in values]
    print(f"reward of {args.config}, window converged at the fast answer's raw {fast.raw:+.3f} (64 values); "
          f"kernelrl from {args.kernelrl_root}")
    print(f"{'rollout':10s} {'n':>3s} {'raw':>8s} {'paid':>8s} {'advantage':>10s}")
    first: dict[str, tuple[float, float, float]] = {}
    for (kind, r), p, a in zip(batch, paid, adv):
        if kind not in first:
            first[kind] = (r.raw, p.value, a)
    for kind, _, n in GROUP:
        got, value, a = first[kind]
        print(f"{kind:10s} {n:3d} {got:+8.3f} {value:+8.3f} {a:+10.3f}")
    a_fast, a_slow, a_fail = first["fast"][2], first["slow"][2], first["failure"][2]
    share = (a_fast - a_slow) / (a_slow - a_fail)
    print(f"clip advantages: fast {a_fast:+.2f}, slow {a_slow:+.2f}, copy {first['copy'][2]:+.2f}, failure "
          f"{a_fail:+.2f}; (fast - slow) / (slow - failure) = {share:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
