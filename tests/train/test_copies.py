"""Copies: what counts as the same program as one a prompt showed, and what does not."""

from __future__ import annotations

import time

from kernelrl.train.copies import is_copy, program_key, shown_keys

KERNEL = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp = """
// scale every element
torch::Tensor scale(torch::Tensor x) {  /* the whole kernel */
    return x * 2;
}
"""


class ModelNew(nn.Module):
    """Twice the input."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        y = torch.relu(x)  # first
        return y * self.factor
'''

RELAID = '''
import torch
import torch.nn as tnn
from torch.utils.cpp_extension import load_inline
cpp = """torch::Tensor scale(torch::Tensor x) { return x * 2; }   // no comment needed"""
class ModelNew(tnn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k
    def forward(self, inp):
        out = torch.relu(inp)
        return out * self.k
'''


def test_layout_comments_docstrings_and_bound_names_do_not_count():
    assert program_key(KERNEL) == program_key(RELAID)


def test_a_different_call_constant_or_statement_is_a_different_program():
    assert program_key(KERNEL) != program_key(KERNEL.replace("torch.relu", "torch.sigmoid"))
    assert program_key(KERNEL) != program_key(KERNEL.replace("x * 2", "x * 3"))
    assert program_key(KERNEL) != program_key(KERNEL.replace("return y * self.factor", "return y + self.factor"))
    assert program_key(KERNEL) != program_key(KERNEL + "\nprint(1)\n")


def test_a_comment_marker_inside_a_c_string_literal_is_kept():
    a = 'src = "printf(\\"//a\\");"\n'
    b = 'src = "printf(\\"//b\\");"\n'
    assert program_key(a) != program_key(b)


def test_a_program_that_does_not_parse_is_compared_by_its_text():
    assert program_key("def f(:\n  pass") == program_key("def f(:   pass")
    assert program_key("def f(:\n  pass") != program_key("def g(:\n  pass")


def test_the_programs_a_prompt_shows_are_its_fenced_blocks():
    prompt = f"Best so far (2.1x):\n```python\n{KERNEL}```\nThe task:\n```python\nclass Model: pass\n```\n"
    shown = shown_keys(prompt)
    assert len(shown) == 2
    assert is_copy(RELAID, shown) and not is_copy(RELAID.replace("* 2", "* 4"), shown)
    assert not is_copy(None, shown) and not is_copy(KERNEL, frozenset())


def test_hostile_text_is_keyed_in_linear_time():
    """Unterminated comments, quotes and deep nesting at the source size limit (256 KiB)."""
    for text in ('x = "' + "/*" * 131072 + '"', "s = '" + "\\'" * 131072, "x = " + "(" * 200000,
                 "'''" + "//" * 131072):
        started = time.monotonic()
        program_key(text)
        assert time.monotonic() - started < 2.0
