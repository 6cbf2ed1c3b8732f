"""The gpu selection's collection rule (tests/conftest.py, tests/optional_extras.py): a module that needs a missing optional
extra is skipped there; anything else stays an error."""

from __future__ import annotations

from optional_extras import missing_extra


def test_a_missing_extra_by_pythons_message_is_named():
    assert missing_extra("E   ModuleNotFoundError: No module named 'fastapi'") == "fastapi"
    assert missing_extra("E   ModuleNotFoundError: No module named 'pydantic.main'") == "pydantic.main"


def test_a_missing_extra_by_a_configs_message_is_named():
    # tests that load every shipped training config at import meet trl's absence this way
    error = "E   kernelrl.config.ConfigError: sft: training needs the optional extra: pip install 'kernelrl[train]' (trl)"
    assert missing_extra(error) == "trl"


def test_a_missing_core_module_or_another_error_stays_an_error():
    assert missing_extra("E   ModuleNotFoundError: No module named 'kernelrl.judge.nothing'") is None
    assert missing_extra("E   ModuleNotFoundError: No module named 'numpy'") is None
    assert missing_extra("E   SyntaxError: invalid syntax") is None
