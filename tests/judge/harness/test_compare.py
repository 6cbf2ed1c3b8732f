"""Output comparison with dtype-aware tolerances."""

from __future__ import annotations

import torch

from kernelrl.judge.harness.compare import compare_outputs, flatten, output_digest


def test_within_fp32_tolerance_passes():
    r = torch.randn(100)
    assert compare_outputs(r + 1e-6, r).ok


def test_outside_fp32_tolerance_fails_with_errors():
    r = torch.randn(100)
    cmp = compare_outputs(r + 1e-2, r)
    assert not cmp.ok and cmp.max_abs_err > 9e-3 and "outside tolerance" in cmp.reason


def test_a_miss_within_a_hundred_times_the_tolerance_is_near_and_one_beyond_is_not():
    r = torch.randn(10_000)
    # what autocast does to an fp32 answer: every value rounded to fp16, about 5e-4 relative
    imprecise = compare_outputs(r.half().float(), r)
    assert not imprecise.ok and imprecise.near
    # one value off by more than 100 x (atol + rtol |r|) is enough to be far
    wrong = r.clone()
    wrong[1234] += 0.5
    assert not compare_outputs(wrong, r).near
    assert not compare_outputs(torch.zeros_like(r), r).near
    assert not compare_outputs(r, r).near  # a comparison that passed is not a near miss


def test_half_precision_has_looser_tolerance():
    r = torch.randn(100).half()
    assert compare_outputs(r * (1 + 4e-3), r).ok
    assert not compare_outputs(r.float() * (1 + 4e-3), r.float()).ok


def test_shape_dtype_and_count_must_match():
    r = torch.randn(4, 4)
    assert "shape" in compare_outputs(r.reshape(16), r).reason
    assert "dtype" in compare_outputs(r.double(), r).reason
    assert "outputs" in compare_outputs((r, r), r).reason


def test_nan_only_where_the_reference_has_nan():
    r = torch.tensor([1.0, float("nan")])
    assert compare_outputs(r.clone(), r).ok
    assert not compare_outputs(torch.tensor([float("nan"), float("nan")]), r).ok


def test_subclass_marker_is_not_a_tensor():
    cmp = compare_outputs({"not_plain_tensor": "evil.Lazy"}, torch.ones(2))
    assert not cmp.ok and "plain torch.Tensor" in cmp.reason


def test_tf32_allowed_gives_fp32_the_half_tolerance_and_nothing_else():
    r = torch.ones(64)
    c = r + 3e-3  # a TF32-sized difference: outside exact fp32's 1e-4, inside fp16's 1e-2
    assert not compare_outputs(c, r).ok
    assert compare_outputs(c, r, tf32=True).ok
    assert not compare_outputs(r + 3e-2, r, tf32=True).ok
    d = torch.ones(64, dtype=torch.float64)
    assert not compare_outputs(d + 3e-3, d, tf32=True).ok  # only float32 computes through TF32


def _exactly_equal(a: object, b: object) -> bool:
    """The equality `output_digest` follows, written out whole: structure, shapes, dtypes and plain
    values the same, tensors value for value with NaN equal to NaN in the same places."""
    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if not (torch.equal(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0))
                    and torch.equal(torch.isnan(x), torch.isnan(y))):
                return False
        elif x != y:
            return False
    return True


def test_the_digest_agrees_with_exact_equality():
    # what the judge keeps of a compared output, to tell an output given again on a later set
    a = torch.tensor([1.0, float("nan"), -0.0, float("inf")])
    pairs = [
        (a, torch.tensor([1.0, float("nan"), 0.0, float("inf")])),  # NaN in the same place, -0.0 as 0.0
        (a, torch.tensor([1.0, 0.0, 0.0, float("inf")])),  # NaN where the other has 0
        (a, a.half()),  # dtype
        (torch.ones(4), torch.ones(2, 2)),  # shape
        ((torch.ones(2), 3), (torch.ones(2), 3)),
        ((torch.ones(2), 3), (torch.ones(2), 4)),  # a plain value in the output
        (torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16)),
    ]
    for x, y in pairs:
        assert (output_digest(x) == output_digest(y)) == _exactly_equal(x, y), (x, y)
    # hashed a chunk at a time: a difference in the last element of a long output is seen
    big = torch.randn(9_000_001)
    moved = big.clone()
    moved[-1] += 1.0
    assert output_digest(big) == output_digest(big.clone()) != output_digest(moved)


def test_a_comparison_a_chunk_at_a_time_gives_the_whole_comparisons_verdict(monkeypatch):
    # the judge compares (and fingerprints) a chunk at a time, so that an output of gigabytes needs
    # no float64 copies of itself; cut into chunks of 7 elements, every verdict and error is the same
    import kernelrl.judge.harness.compare as compare

    gen = torch.Generator().manual_seed(0)
    cases = []
    for n in (1, 7, 20, 64):
        r = torch.randn(n, generator=gen)
        cases += [(r.clone(), r), (r + 1e-6, r), (r * 1.01, r)]
        bad = r.clone()
        bad[-1] += 1.0  # wrong in the last chunk only
        cases.append((bad, r))
        nan = r.clone()
        nan[-1] = float("nan")
        cases += [(nan, r), (nan, nan.clone())]
        inf = r.clone()
        inf[n // 2] = float("inf")
        other = inf.clone()
        other[n // 2] = float("-inf")
        cases += [(inf, inf.clone()), (other, inf), (r, inf)]
    for c, r in cases:
        whole, same = compare_outputs(c, r), output_digest(c) == output_digest(r)
        monkeypatch.setattr(compare, "_CHUNK", 7)
        monkeypatch.setattr(compare, "_COMPARE_CHUNK", 7)
        assert compare_outputs(c, r) == whole and (output_digest(c) == output_digest(r)) == same, (c, r)
        monkeypatch.setattr(compare, "_CHUNK", 1 << 22)
        monkeypatch.setattr(compare, "_COMPARE_CHUNK", 1 << 22)


def test_a_finite_chunks_short_way_counts_what_the_definition_counts(monkeypatch):
    # finite chunks skip the NaN and infinity handling: their maxima and counts are the definition's,
    # computed here on the whole output in float64, for every floating dtype; a float64 reference
    # (compared without a copy) is left as it was
    import kernelrl.judge.harness.compare as compare

    monkeypatch.setattr(compare, "_COMPARE_CHUNK", 5)
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        r = (torch.randn(23, generator=gen) * 3).to(dtype)
        r[4] = 0.0  # a zero reference: the relative error's floor
        noise = torch.randn(23, generator=gen) * torch.tensor([1e-6, 1e-3, 0.5]).repeat(8)[:23]
        c = (r.to(torch.float64) + noise).to(dtype)
        kept = r.clone()
        atol, rtol = compare.tolerance(dtype)
        got = compare._leaf_errors(c, r, atol, rtol)
        c64, r64 = c.to(torch.float64), r.to(torch.float64)
        diff, allowed = (c64 - r64).abs(), atol + rtol * r64.abs()
        assert torch.equal(r, kept)
        assert got.nan_differ == 0 and not got.inf_differ
        assert got.max_abs == float(diff.max())
        assert got.max_rel == float((diff / r64.abs().clamp_min(1e-12)).max())
        assert got.outside == int((diff > allowed).sum()) > 0, dtype
        assert got.far == int((diff > compare.NEAR_FACTOR * allowed).sum())


def test_content_digest_tells_any_written_byte_and_nothing_else():
    from kernelrl.judge.harness.compare import content_digest

    x = torch.randn(3000)
    assert content_digest(x) == content_digest(x.clone())
    for change in (lambda t: t.__setitem__(1234, t[1234] * 2), lambda t: t.__setitem__(0, -0.0 if t[0] == 0 else 0.0)):
        y = x.clone()
        change(y)
        assert content_digest(y) != content_digest(x)
    zero, negative_zero = torch.zeros(4), torch.zeros(4)
    negative_zero[2] = -0.0
    assert content_digest(zero) != content_digest(negative_zero)  # a zero's sign rewritten is a write
    wide = torch.randn(64, 50).t()  # not contiguous: read rows at a time, same bytes as its copy
    assert content_digest(wide) == content_digest(wide.contiguous())
    assert content_digest([x, 1]) != content_digest([x, 2]) and content_digest(x) != content_digest(x.view(30, 100))
