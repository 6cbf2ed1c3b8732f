"""kernelrl: make PyTorch programs faster with LLM-written kernels, and train those LLMs with RL.

The data path, one folder per stage:

    tasks/    reference programs (KernelBench format), suites, size presets, degeneracy filter
    search/   contrastive prompts, proposers, the code database, the search loop
    judge/    the evaluator (the reward): sandboxed workers, correctness, group timing, roofline
    checks/   what a candidate may not do: static rules, dynamic defences, policies, audit
              inputs and records, the adversarial LLM judge
    audit.py  published kernels through the checks and, when asked, the judge (`kernelrl audit`)
    reward.py verdict -> scalar (correctness gate, speedup term, penalties, CUDA-L1's clip)
    train/    SFT data collection, SFT, rejection-sampling fine-tuning, contrastive GRPO on TRL
    serve/    the reward as an HTTP service, its client, Ray scale-out, RL-framework adapters
    report/   fast_p, pass@k, geomean and median vs eager and torch.compile, % of roofline, plots

Shared vocabulary at the top: `candidate.py` (programs and their extraction from answers),
`result.py` (typed verdicts), `config.py` (run configs from TOML), `endpoint.py` (retry policy
for model endpoints), `client.py` (the reward server's client); `cli/` is the `kernelrl` command.
"""

__version__ = "0.2.0"
