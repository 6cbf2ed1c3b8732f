"""Which collection errors are a missing optional extra (tests/conftest.py skips those under `-m gpu`).

A module of its own, not the conftest: several folders have a conftest.py, and `import conftest`
gets whichever was imported first.
"""

from __future__ import annotations

import re

# Top-level modules of pyproject's optional extras (hf, train, gpu, serve, watch, dev's test tools).
# pydantic and starlette come with the serve extra (fastapi's own needs), which backends/api.py imports directly.
OPTIONAL_MODULES = frozenset({"transformers", "trl", "datasets", "peft", "accelerate", "vllm", "deepspeed",
                              "flash_attn", "fastapi", "uvicorn", "starlette", "pydantic", "httpx", "ray",
                              "selenium", "hypothesis"})
# Python's own message, and the one kernelrl's configs give when a config needs an extra that is missing
# (tests that load every shipped training config at import).
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'"
                      r"|needs the optional extra: pip install '[^']+' \(([A-Za-z0-9_.]+)\)")


def missing_extra(error: str) -> str | None:
    """The optional module whose absence `error` (a collection error's text) reports, if that is what it reports."""
    missing = _MISSING.search(error)
    name = missing and (missing.group(1) or missing.group(2))
    return name if name and name.split(".")[0] in OPTIONAL_MODULES else None
