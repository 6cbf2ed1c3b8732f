"""How far `work_before_timed_call` sits between honest programs and work moved out of the call.

Judges, in groups of six on the SiLU check task, the red-team program that computes its outputs
while the harness prepares a sample (tests/fixtures/redteam/precompute_in_prepare.py) beside five
honest programs (F.silu, and copies of the reference), and prints, for every member, how much
longer its sample preparation took than the nearer trusted copy's (`prepare_excess_ms`) and what
the rule allowed (`prepare_allowed_ms`), with its verdict. The margins on both sides are the figure
to watch: honest programs must stay well under the allowance, the moved work well over.

    python3 benchmarks/work_before_timer.py --groups 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kernelrl.candidate import Candidate
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.harness.device import Device
from kernelrl.tasks.task import load_task_file

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "tests/fixtures/tasks/elementwise_silu.py"
MOVED = ROOT / "tests/fixtures/redteam/precompute_in_prepare.py"
HONEST = {
    "F.silu": "import torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass ModelNew(nn.Module):\n"
              "    def forward(self, x):\n        return F.silu(x)\n",
    "reference copy": "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                      "    def forward(self, x):\n        return x * torch.sigmoid(x)\n",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--max-timing-s", type=float, default=3.0, help="timing budget per group (the red-team tests' 3 s)")
    args = ap.parse_args()
    task = load_task_file(TASK)
    members = [("moved work", MOVED.read_text())] + [(name, src) for _ in range(3) for name, src in HONEST.items()][:5]
    config = EvalConfig(device=Device.CPU, policy=PolicyName.OBSERVE, timeout_s=180,
                        timing=TimingConfig(max_timing_s=args.max_timing_s, max_rounds=150))
    worst_honest, least_moved = -float("inf"), float("inf")
    with Evaluator(config) as ev:
        for g in range(args.groups):
            # a comment makes each program new to the judge's memory of what it judged
            batch = [(task, Candidate(source=f"{src}\n# group {g} member {i}\n", origin=name))
                     for i, (name, src) in enumerate(members)]
            for (name, _), res in zip(members, ev.evaluate_batch(batch)):
                t = res.environment.timing
                if t is None:
                    print(f"group {g}  {name:15s} {res.status.value}: no timing ({res.message})")
                    continue
                margin = t.prepare_excess_ms - t.prepare_allowed_ms
                if name == "moved work":
                    least_moved = min(least_moved, margin)
                else:
                    worst_honest = max(worst_honest, margin)
                print(f"group {g}  {name:15s} excess {t.prepare_excess_ms:6.2f} ms  allowed {t.prepare_allowed_ms:5.2f} ms"
                      f"  {res.status.value:8s} {', '.join(sorted({f.rule for f in res.findings}))}")
    print(f"closest honest program: {worst_honest:+.2f} ms from the allowance; "
          f"least moved work: {least_moved:+.2f} ms (beyond it is found)")


if __name__ == "__main__":
    main()
