"""kernelrl: make PyTorch programs faster with LLM-written kernels, and train those LLMs with RL.

The data path is task -> prompt -> proposer -> candidate -> evaluator -> result -> database
-> reward -> trainer, with reports on top; each noun is one module of this package.
"""

__version__ = "0.1.0"
