"""The one adapter over TRL's private generation (`kernelrl.train.trl_generate`), pinned to the
installed TRL: this fails when TRL is upgraded or its private methods change, before a
multi-turn GRPO run would."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kernelrl.train.trl_generate import PRIVATE_API, TESTED_TRL, TrlApiChanged, check_trainer, generate


def test_the_installed_trl_is_the_one_the_adapter_was_checked_against() -> None:
    trl = pytest.importorskip("trl")
    from trl.trainer.grpo_trainer import GRPOTrainer

    assert trl.__version__ == TESTED_TRL, (
        f"TRL {trl.__version__} is installed; kernelrl.train.trl_generate was checked against TRL {TESTED_TRL}: "
        f"read GRPOTrainer.{' and .'.join(PRIVATE_API)} in the new version, update the adapter and TESTED_TRL")
    check_trainer(GRPOTrainer)  # the parameters, by name


def test_a_changed_private_method_is_refused_by_name() -> None:
    class Renamed:
        def _tokenize_prompts(self, prompts: list[Any]) -> Any: ...

        def _generate_single_turn(self, ids: Any, images: Any, fields: Any, n: int) -> Any: ...

    class Fewer(Renamed):
        def _generate_single_turn(self, prompt_ids: Any) -> Any:  # type: ignore[override]
            ...

    class Gone:
        def _tokenize_prompts(self, prompts: list[Any]) -> Any: ...

    check_trainer(Renamed, names=False)  # what generate checks: the call still binds
    with pytest.raises(TrlApiChanged, match="_generate_single_turn takes"):
        check_trainer(Renamed)
    with pytest.raises(TrlApiChanged, match="_generate_single_turn takes"):
        check_trainer(Fewer, names=False)
    with pytest.raises(TrlApiChanged, match="_generate_single_turn is gone"):
        check_trainer(Gone, names=False)


def test_generate_tokenizes_generates_once_and_decodes() -> None:
    calls: list[Any] = []

    class Trainer:
        processing_class = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [f"answer {i[0]}" for i in ids])

        def _tokenize_prompts(self, prompts: list[str]) -> Any:
            calls.append(("tokenize", prompts))
            return [[len(p)] for p in prompts], "images", {"pixels": 1}

        def _generate_single_turn(self, prompt_ids: Any, images: Any, fields: Any, n: int) -> Any:
            calls.append(("generate", prompt_ids, images, fields, n))
            return [[7], [8]], None

    out = generate(Trainer(), ["ab", "abc"])
    assert calls == [("tokenize", ["ab", "abc"]), ("generate", [[2], [3]], None, {}, 1)]
    assert out.prompt_ids == [[2], [3]] and out.completion_ids == [[7], [8]] and out.logprobs is None
    assert out.answers == ["answer 7", "answer 8"]
