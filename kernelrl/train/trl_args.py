"""TRL's own configs (`SFTConfig`, `GRPOConfig`) from a run config's `[<stage>.trl]` table.

The stages hold TRL's options as a table of TRL's own field names instead of re-declaring them,
so every option TRL has (num_generations, beta, epsilon_high, loss_type, scale_rewards,
use_vllm / vllm_mode, gradient_accumulation_steps, save_steps, ...) is available under the name
TRL documents, and a new TRL option needs no change here.

Guarantees: `check_keys` refuses a key that is not a field of the TRL class, naming it
(`grpo.trl.num_generation: not a GRPOConfig setting`), without building the TRL object, so a run
config for GPUs can be checked on a machine without one; `build_args` builds the object with the
stage's output folder and the settings a stage must fix (`forced`), and turns TRL's own
validation errors into `ConfigError`.

Does not choose defaults: TRL's defaults apply unless the run config sets a value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from kernelrl.config import ConfigError

T = TypeVar("T")

# Set by the stage, never by the run config: the stage's folder is `output_dir / <stage>`.
RESERVED = ("output_dir",)


def trl_class(name: str) -> type:
    """`SFTConfig` or `GRPOConfig` (imported on use: TRL is the optional extra `train`)."""
    try:
        import trl
    except ImportError:
        raise ConfigError("training needs the optional extra: pip install 'kernelrl[train]' (trl)") from None
    cls: type = getattr(trl, name)
    return cls


def check_keys(cls: type, values: Mapping[str, object], *, where: str) -> None:
    """Every key of `values` is a field of TRL's `cls`, and none is reserved."""
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in values:
        if key in RESERVED:
            raise ConfigError(f"{where}.{key}: set by kernelrl (the stage's folder under the run's output_dir)")
        if key not in fields:
            close = sorted(f for f in fields if f.startswith(key[:4]))[:5]
            hint = f"; similar: {', '.join(close)}" if close else ""
            raise ConfigError(f"{where}.{key}: not a {cls.__name__} setting{hint}")


def build_args(cls: type[T], values: Mapping[str, Any], *, output_dir: Path, where: str,
               forced: Mapping[str, Any] | None = None) -> T:
    """TRL's config object for one stage: the run config's values, then `forced` on top."""
    check_keys(cls, values, where=where)
    kwargs = {**values, **(forced or {}), "output_dir": str(output_dir)}
    try:
        return cls(**kwargs)
    except TypeError as e:
        m = re.search(r"argument '(\w+)'", str(e))
        raise ConfigError(f"{where}.{m.group(1) if m else '?'}: {e}") from e
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e
