"""The whole recipe on two CPU cores: does a policy that writes its own programs, token by token,
learn to write faster ones?

It runs the commands a user types, with the named run config `tiny-cpu-learn` (written under
`--out` with its output folder and database there, every other setting the config's):

    kernelrl collect --recipe CFG                       # the SFT set: fast and slow programs per task
    kernelrl train sft --config CFG
    kernelrl bench --recipe CFG --proposer hf:OUT/sft/final ... --json
    kernelrl train rft --config CFG
    kernelrl bench ... (the RFT model)
    kernelrl train grpo --config CFG                    # contrastive GRPO, shown versions drawn by score
    kernelrl bench ... (the GRPO model), then the same on the test split

Every stage and bench is a run of one database (`OUT/code.db`), judged under the config's one
[eval]: a program judged once is reused by every stage; `--watch-port N` serves its run page
while the recipe runs. Each bench samples k programs per train-split task with the first-attempt
prompt and reports, with 95 % bootstrap intervals over its samples:

- pass@1: the share of samples that are correct;
- fast_1: the share of samples that are correct and faster than eager beyond noise (as every
  report counts it: a speedup within the A/A band or whose interval holds 1.0x is not faster);
- the geometric mean speedup over the correct samples;
- copies: the share of samples that are a program of the SFT set up to edits that change nothing
  (`kernelrl.train.copies`, the rule the reward pays copies by) and not faster beyond noise;
- hacks: the share refused by a defence.

Then the GRPO curve (per step: mean reward, share correct, fast_1 of its rollouts, loss, share of
copies, share of prompts that showed the best known version) and the stage table with each stage's
wall time. PASS when, on the train split, fast_1 after GRPO is at least 0.25 above after SFT with
the difference's bootstrap lower bound above 0, pass@1 after GRPO at most 0.1 below after SFT, and
no GRPO rollout that is a hack or a copy was paid more than the reward's lowest correct-at-1.0x
value (a hack: more than the failure penalty).

`--plain`: GRPO again from the same RFT model and a copy of the database as RFT left it, same
steps, with prompts that show no earlier version; both curves and tables side by side.
`--control speed-blind`: GRPO again from the same RFT model and database copy with every correct
answer paid alike (the reward's speedup floor and cap both 1.0; SFT and RFT never read speed, so
the control differs from the recipe only there): its criterion must fail (the check can fail).
`--short`: a shortened run for the slow test (fewer steps and samples; its verdict means nothing).
`--readme`: write the stage tables into benchmarks/README.md ("The recipe on two cores").

Usage: python3 benchmarks/recipe_check.py [--out DIR] [--plain] [--control speed-blind] [--short]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "kernelrl" / "configs" / "train" / "tiny-cpu-learn.toml"
TEST_TASKS = ("level1/softmax", "level2/linear_bias_gelu_scale")  # test split: benched, reported as is
README = ROOT / "benchmarks" / "README.md"
SECTION = "## The recipe on two cores: a policy that writes its own programs"
BOOTSTRAP = 2000


@dataclass
class Sample:
    task: str
    correct: bool
    fast: bool  # correct and faster than eager beyond noise
    speedup: float | None
    copy: bool
    hack: bool


@dataclass
class BenchRow:
    name: str
    seconds: float
    samples: list[Sample]

    def share(self, what: str) -> tuple[float, float, float]:
        return with_interval([float(getattr(s, what)) for s in self.samples])

    def geomean(self) -> tuple[float, float, float] | None:
        logs = [math.log(s.speedup) for s in self.samples if s.correct and s.speedup]
        if not logs:
            return None
        mean, lo, hi = with_interval(logs)
        return math.exp(mean), math.exp(lo), math.exp(hi)


@dataclass
class Outcome:
    stages: list[tuple[str, float]] = field(default_factory=list)  # (stage, seconds)
    benches: dict[str, BenchRow] = field(default_factory=dict)
    curve: list[dict[str, float]] = field(default_factory=list)
    paid_hacks: int = 0
    paid_copies: int = 0
    grpo_rows: int = 0


def with_interval(values: Sequence[float], *, seed: int = 0) -> tuple[float, float, float]:
    """The mean and its 95 % bootstrap interval."""
    if not values:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(BOOTSTRAP))
    return sum(values) / n, means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]


def difference_lower_bound(after: Sequence[float], before: Sequence[float], *, seed: int = 0) -> float:
    """The 2.5 % bootstrap quantile of mean(after) - mean(before), each resampled on its own."""
    rng = random.Random(seed)
    diffs = sorted(sum(rng.choice(after) for _ in after) / len(after) - sum(rng.choice(before) for _ in before)
                   / len(before) for _ in range(BOOTSTRAP))
    return diffs[int(0.025 * BOOTSTRAP)]


# Each finished step's wall time, kept in OUT/steps.json as it ends: `--resume` skips what finished
# (a run cut short, or stopped by a failing later step, keeps everything it computed).
DONE: dict[str, float] = {}
DONE_FILE = "steps.json"


def finished(out: Path, key: str, seconds: float) -> float:
    DONE[key] = seconds
    (out / DONE_FILE).write_text(json.dumps(DONE, indent=1) + "\n")
    return seconds


def run(cmd: list[str], log: Path, key: str) -> float:
    """Run a kernelrl command, its output appended to `log`; its wall time. A failure stops the check;
    a step that finished before (`--resume`) is not run again."""
    if key in DONE:
        return DONE[key]
    started = time.monotonic()
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        done = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        sys.exit(f"recipe check: `{' '.join(cmd)}` exited {done.returncode}; its output is in {log}")
    return finished(log.parent, key, time.monotonic() - started)


def stage_model(out: Path, stage: str) -> Path:
    """Where a finished stage's model is (RFT's is its last round's)."""
    from kernelrl.train.stage import Stage, finished_model

    model = finished_model(out, Stage(stage))
    if model is None:
        sys.exit(f"recipe check: the {stage} stage left no finished model under {out}")
    return Path(model)


def kernelrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelrl", *args]


def write_config(out: Path, *, short: bool, steps: int | None) -> Path:
    """tiny-cpu-learn with its output folder under `out` (and the shortened settings)."""
    text = CONFIG.read_text()
    text = text.replace('output_dir = "runs/tiny-cpu-learn"', f'output_dir = "{out}"')
    text = text.replace('path = "runs/tiny-cpu-learn/base"', f'path = "{out / "base"}"')
    text = text.replace('"replay:benchmarks/recipe/answers.jsonl"', f'"replay:{ROOT / "benchmarks/recipe/answers.jsonl"}"')
    values = tomllib.loads(text)
    if values["output_dir"] != str(out):
        sys.exit(f"recipe check: {CONFIG} no longer names its output folder as this script expects")
    extra = []
    if short:
        extra.append("# --short")
        text = re.sub(r"(?m)^num_train_epochs = \d+$", "num_train_epochs = 2", text, count=1)
        text = re.sub(r"(?m)^samples_per_task = \d+$", "samples_per_task = 2", text)
        text = re.sub(r"(?m)^max_steps = \d+$", "max_steps = 2", text)
        text = re.sub(r"(?m)^k = \d+$", "k = 2", text)
    if steps is not None:
        text = re.sub(r"(?m)^max_steps = \d+$", f"max_steps = {steps}", text)
    path = out / "tiny-cpu-learn.toml"
    path.write_text(text + "\n".join(extra))
    tomllib.loads(path.read_text())
    return path


def bench(name: str, cfg: Path, model: Path, out: Path, log: Path, *, split: str = "train",
          tasks: Sequence[str] = (), db: Path | None = None) -> BenchRow:
    values = tomllib.loads(cfg.read_text())
    spec = f"hf:{model} max_new_tokens={values['grpo']['trl']['max_completion_length']} " \
           f"temperature={values['grpo']['trl']['temperature']}"
    report = out / f"bench-{name}.json"
    cmd = kernelrl("bench", "--recipe", str(cfg), "--proposer", spec, "--split", split, "--json")
    if tasks:
        cmd += ["--tasks", *tasks]
    if db is not None:
        cmd += ["--db", str(db)]
    key = f"bench-{name}"
    if key in DONE and report.is_file():
        seconds = DONE[key]
    else:
        started = time.monotonic()
        with log.open("a") as f, report.open("w") as r:
            f.write(f"\n$ {' '.join(cmd)}\n")
            f.flush()
            done = subprocess.run(cmd, cwd=ROOT, stdout=r, stderr=f, check=False)
        if done.returncode != 0:
            sys.exit(f"recipe check: bench {name} exited {done.returncode}; its output is in {log}")
        seconds = finished(out, key, time.monotonic() - started)
    return BenchRow(name=name, seconds=seconds, samples=bench_samples(json.loads(report.read_text()),
                                                                     db or out / "code.db"))


def bench_samples(report: dict[str, object], db: Path) -> list[Sample]:
    """Each sample of a bench (its run's candidates), with its copy flag read against the SFT set's
    programs (the collect stage's correct ones), by the rule the reward pays copies by."""
    from kernelrl.result import Status
    from kernelrl.store import Database
    from kernelrl.store.records import RunStage
    from kernelrl.train.copies import Comparer, ShownVersion

    run_id = report.get("run_id")
    if not isinstance(run_id, int):
        sys.exit("recipe check: the bench report names no run (was it given a database?)")
    with Database(db) as d:
        versions: dict[str, list[ShownVersion]] = {}
        for rec in d.candidates():
            if rec.meta.stage is RunStage.COLLECT and rec.is_correct:
                versions.setdefault(rec.task, []).append(ShownVersion(id=rec.id, source=rec.source, result=rec.result))
        comparers = {task: Comparer(shown) for task, shown in versions.items()}
        return [Sample(task=rec.task, correct=rec.is_correct, fast=is_fast(rec.result), speedup=rec.speedup,
                       copy=rec.is_correct and rec.task in comparers
                       and comparers[rec.task].copy_of(rec.source or None, rec.result) is not None,
                       hack=rec.status is Status.FLAGGED)
                for rec in d.candidates(run_id=run_id)]


def is_fast(result: object) -> bool:
    from kernelrl.report.metrics import counts_as_faster
    from kernelrl.result import EvalResult, Status
    from kernelrl.reward import within_noise

    if not isinstance(result, EvalResult) or result.status is not Status.CORRECT:
        return False
    return counts_as_faster(result.speedup, 1.0, within_noise=within_noise(result))


def grpo_curve(db: Path, cfg: Path, outcome: Outcome) -> None:
    """Per GRPO step, from the run database: mean reward, share correct, fast_1, copies, best shown;
    the loss from the step log. Also counts the hacks and copies that were paid."""
    from kernelrl.config import build
    from kernelrl.result import Status
    from kernelrl.reward import RewardConfig, speed_term
    from kernelrl.store import Database
    from kernelrl.store.records import RunStage

    reward = build(RewardConfig, tomllib.loads(cfg.read_text()).get("reward", {}))
    no_speedup = reward.correct_bonus + speed_term(reward.mapping, 1.0) + reward.format_weight
    with Database(db) as d:
        runs = [r for r in d.runs() if r.config.get("stage") == "grpo"]
        if not runs:
            sys.exit("recipe check: the database holds no GRPO run")
        run_id = runs[-1].id
        best: dict[str, tuple[float, int]] = {}  # task -> (speedup, id) of the best known so far
        steps: dict[int, list[tuple[object, bool]]] = {}
        for rec in sorted(d.candidates(), key=lambda r: r.id):
            if rec.run_id == run_id and rec.meta.stage is RunStage.GRPO and rec.meta.step is not None:
                known = best.get(rec.task)
                shown_best = known is not None and known[1] in (rec.meta.shown or ())
                steps.setdefault(rec.meta.step, []).append((rec, shown_best))
                outcome.grpo_rows += 1
                if rec.meta.raw is not None:
                    if rec.status is Status.FLAGGED and rec.meta.raw > reward.penalties.highest:
                        outcome.paid_hacks += 1
                    if rec.meta.copy and rec.meta.raw > no_speedup + 1e-9:
                        outcome.paid_copies += 1
            if rec.is_correct and rec.speedup is not None and (rec.task not in best or rec.speedup > best[rec.task][0]):
                best[rec.task] = (rec.speedup, rec.id)
        losses = {r.step: r.metrics.get("loss") for r in d.train_steps(run_id)}
    for step in sorted(steps):
        rows = steps[step]
        recs = [r for r, _ in rows]
        paid = [r.meta.reward for r in recs if r.meta.reward is not None]  # type: ignore[attr-defined]
        outcome.curve.append({
            "step": step, "reward": sum(paid) / len(paid) if paid else math.nan,
            "correct": sum(r.is_correct for r in recs) / len(recs),  # type: ignore[attr-defined]
            "fast_1": sum(is_fast(r.result) for r in recs) / len(recs),  # type: ignore[attr-defined]
            "copies": sum(bool(r.meta.copy) for r in recs) / len(recs),  # type: ignore[attr-defined]
            "best_shown": sum(b for _, b in rows) / len(rows),
            "loss": losses.get(step + 1, math.nan) or math.nan})


def collected_table(db: Path) -> list[str]:
    """The SFT set's programs as collect measured them: which are faster than eager beyond noise."""
    from kernelrl.store import Database
    from kernelrl.store.records import RunStage

    lines = ["| task | program (its answer's first line) | speedup | 95 % interval | A/A band | faster beyond noise |",
             "|---|---|---|---|---|---|"]
    with Database(db) as d:
        for rec in sorted(d.candidates(), key=lambda r: (r.task, r.id)):
            if rec.meta.stage is not RunStage.COLLECT or rec.result is None:
                continue
            r = rec.result
            ci = f"[{r.speedup_ci[0]:.3f}, {r.speedup_ci[1]:.3f}]" if r.speedup_ci else "-"
            band = f"[{r.noise_band[0]:.3f}, {r.noise_band[1]:.3f}]" if r.noise_band else "-"
            speed = f"{r.speedup:.3f}x" if r.speedup else r.status.value
            lines.append(f"| {rec.task} | {rec.answer.splitlines()[0][:70]} | {speed} | {ci} | {band} | "
                         f"{'yes' if is_fast(r) else 'no'} |")
    return lines


def fmt(v: tuple[float, float, float] | None, *, pct: bool = False, x: bool = False) -> str:
    if v is None or math.isnan(v[0]):
        return "-"
    if x:
        return f"{v[0]:.2f}x [{v[1]:.2f}, {v[2]:.2f}]"
    return f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"


def stage_table(o: Outcome) -> list[str]:
    lines = ["| bench | samples | pass@1 | fast_1 | geomean (correct) | copies of SFT programs | hacks | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for name, b in o.benches.items():
        lines.append(f"| {name} | {len(b.samples)} | {fmt(b.share('correct'))} | {fmt(b.share('fast'))} | "
                     f"{fmt(b.geomean(), x=True)} | {fmt(b.share('copy'))} | {fmt(b.share('hack'))} | "
                     f"{b.seconds:.0f} |")
    lines += ["", "| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {sec:.0f} |" for name, sec in o.stages]
    lines.append(f"| total | {sum(sec for _, sec in o.stages):.0f} |")
    return lines


def curve_table(o: Outcome) -> list[str]:
    lines = ["| step | reward | correct | fast_1 | copies | best shown | loss |", "|---|---|---|---|---|---|---|"]
    for c in o.curve:
        lines.append(f"| {int(c['step'])} | {c['reward']:.3f} | {c['correct']:.2f} | {c['fast_1']:.2f} | "
                     f"{c['copies']:.2f} | {c['best_shown']:.2f} | {c['loss']:.4f} |")
    return lines


def verdict(o: Outcome, *, grpo: str = "after GRPO") -> tuple[bool, str]:
    sft, after = o.benches["after SFT"], o.benches[grpo]
    fast_sft = [float(s.fast) for s in sft.samples]
    fast_grpo = [float(s.fast) for s in after.samples]
    gain = sum(fast_grpo) / len(fast_grpo) - sum(fast_sft) / len(fast_sft)
    lower = difference_lower_bound(fast_grpo, fast_sft)
    pass_drop = sft.share("correct")[0] - after.share("correct")[0]
    ok = gain >= 0.25 and lower > 0 and pass_drop <= 0.1 and o.paid_hacks == 0 and o.paid_copies == 0
    line = (f"fast_1 after SFT {sum(fast_sft) / len(fast_sft):.3f}, after GRPO {sum(fast_grpo) / len(fast_grpo):.3f}, "
            f"difference {gain:+.3f} (bootstrap lower bound {lower:+.3f}); pass@1 {sft.share('correct')[0]:.3f} -> "
            f"{after.share('correct')[0]:.3f}; GRPO rows paid as hacks {o.paid_hacks}, as copies {o.paid_copies} "
            f"(of {o.grpo_rows}): {'PASS' if ok else 'FAIL'}")
    return ok, line


def recipe(out: Path, args: argparse.Namespace, log: Path) -> Outcome:
    o = Outcome()
    cfg = write_config(out, short=args.short, steps=args.steps)
    print(f"recipe check: config {cfg}, log {log}", flush=True)
    o.stages.append(("collect", run(kernelrl("collect", "--recipe", str(cfg)), log, "collect")))
    o.stages.append(("sft", run(kernelrl("train", "sft", "--config", str(cfg)), log, "sft")))
    o.benches["after SFT"] = bench("sft", cfg, stage_model(out, "sft"), out, log)
    o.stages.append(("bench after SFT", o.benches["after SFT"].seconds))
    o.stages.append(("rft", run(kernelrl("train", "rft", "--config", str(cfg)), log, "rft")))
    o.benches["after RFT"] = bench("rft", cfg, stage_model(out, "rft"), out, log)
    o.stages.append(("bench after RFT", o.benches["after RFT"].seconds))
    if "grpo" not in DONE:
        shutil.copyfile(out / "code.db", out / "code-after-rft.db")  # the other GRPO arms start from it
    o.stages.append(("grpo", run(kernelrl("train", "grpo", "--config", str(cfg)), log, "grpo")))
    grpo_curve(out / "code.db", cfg, o)
    o.benches["after GRPO"] = bench("grpo", cfg, stage_model(out, "grpo"), out, log)
    o.stages.append(("bench after GRPO", o.benches["after GRPO"].seconds))
    o.benches["after GRPO, test split"] = bench("grpo-test", cfg, stage_model(out, "grpo"), out, log, split="test",
                                                tasks=TEST_TASKS)
    o.stages.append(("bench after GRPO, test split", o.benches["after GRPO, test split"].seconds))
    return o


# The other GRPO arms, each from the same RFT model and a copy of the database as RFT left it.
ARMS = {
    "plain": ("no earlier version shown (every prompt the first-attempt prompt)", ["--grpo.contrast.draw", "none"]),
    "speed-blind": ("every correct answer paid alike (speedup floor and cap 1.0): the criterion must fail",
                    ["--reward.speedup-floor", "1.0", "--reward.speedup-cap", "1.0"]),
}


def arm(name: str, out: Path, log: Path, cfg: Path, sft: BenchRow) -> Outcome:
    """GRPO from the same RFT model and database copy, with the arm's settings; then its bench
    (beside the recipe's bench after SFT, `sft`, which its verdict compares against)."""
    o = Outcome(benches={"after SFT": sft})
    arm_out = out / name
    db = out / f"code-{name}.db"
    if f"grpo-{name}" not in DONE:
        shutil.copyfile(out / "code-after-rft.db", db)
    cmd = kernelrl("train", "grpo", "--config", str(cfg), *ARMS[name][1], "--db-path", str(db),
                   "--output-dir", str(arm_out), "--grpo.init-from", str(stage_model(out, "rft")))
    o.stages.append((f"grpo ({name})", run(cmd, log, f"grpo-{name}")))
    grpo_curve(db, cfg, o)
    o.benches[f"after GRPO ({name})"] = bench(f"grpo-{name}", cfg, stage_model(arm_out, "grpo"), out, log, db=db)
    o.stages.append((f"bench after GRPO ({name})", o.benches[f"after GRPO ({name})"].seconds))
    return o


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "recipe_check", help="where the run goes (emptied first)")
    ap.add_argument("--plain", action="store_true", help="also GRPO with prompts showing no earlier version")
    ap.add_argument("--control", choices=("speed-blind",), default=None,
                    help="also GRPO with every correct answer paid alike: its criterion must fail")
    ap.add_argument("--short", action="store_true", help="a shortened run (the slow test): stages, not learning")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the config's)")
    ap.add_argument("--watch-port", type=int, default=None, help="serve the run page on this port while it runs")
    ap.add_argument("--readme", action="store_true", help="write the tables into benchmarks/README.md")
    ap.add_argument("--resume", action="store_true", help="keep OUT and skip the steps it finished (OUT/steps.json)")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    if args.resume and (out / DONE_FILE).is_file():
        DONE.update(json.loads((out / DONE_FILE).read_text()))
    elif out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "recipe.log"
    started = time.monotonic()
    page = None
    if args.watch_port is not None:
        # one page over the run's database for every stage, as `kernelrl watch --db` from another
        # terminal serves it (a stage's own --watch.port page lingers after its stage, on the port
        # the next stage would ask for)
        page = subprocess.Popen(kernelrl("watch", "--db", str(out / "code.db"), "--port", str(args.watch_port)),
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"recipe check: run page at http://127.0.0.1:{args.watch_port}/", flush=True)
    try:
        return report(out, args, log, started, argv)
    finally:
        if page is not None:
            page.terminate()
            page.wait(10)


def report(out: Path, args: argparse.Namespace, log: Path, started: float, argv: list[str] | None) -> int:
    o = recipe(out, args, log)
    lines = [f"command: python3 benchmarks/recipe_check.py {' '.join(argv if argv is not None else sys.argv[1:])}",
             "", "The SFT set as collect judged it:", "", *collected_table(out / "code.db"), "", *stage_table(o),
             "", "GRPO curve (its rollouts, per step):", "", *curve_table(o)]
    ok, last = verdict(o)
    lines += ["", f"recipe wall time {sum(sec for _, sec in o.stages):.0f} s (collect to the last bench)"]
    for name in [n for n, on in (("plain", args.plain), (args.control, bool(args.control))) if on and n]:
        a = arm(name, out, log, out / "tiny-cpu-learn.toml", o.benches["after SFT"])
        a_ok, a_last = verdict(a, grpo=f"after GRPO ({name})")
        lines += ["", f"--- {name}: GRPO from the same RFT model and database copy, {ARMS[name][0]}:", "",
                  *stage_table(a), "", *curve_table(a), "", f"{name}: {a_last}"]
        if name != "plain" and a_ok:
            lines.append(f"{name}: the control PASSED, so the criterion cannot tell learning from its absence")
    lines += ["", f"wall time {time.monotonic() - started:.0f} s", "", last]
    text = "\n".join(lines)
    print(text)
    (out / "recipe_check.md").write_text(text + "\n")
    if args.readme:
        write_readme(text)
    return 0 if ok or args.short else 1


def write_readme(text: str) -> None:
    """The run's output under the README's recipe section (replacing the one there)."""
    body = README.read_text()
    block = f"{SECTION}\n\n```\n{text}\n```\n"
    if SECTION in body:
        start = body.index(SECTION)
        end = body.find("\n## ", start + len(SECTION))
        body = body[:start] + block + ("" if end < 0 else body[end:])
    else:
        body = body.rstrip("\n") + "\n\n" + block
    README.write_text(body)


if __name__ == "__main__":
    sys.exit(main())
