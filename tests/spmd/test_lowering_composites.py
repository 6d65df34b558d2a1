"""Ops that reach the device as fused kernels or in-place view changes: TransformerEncoderLayer's eval fast
path, MultiheadAttention's, embedding_bag, vec @ mat (squeeze_), dropout2d/alpha_dropout, empty shapes.

All run natively (the CPU fallback stays off) and are compared with torch on the CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401


def _mesh() -> xs.Mesh:
    return xs.Mesh(range(8), (2, 4), ("data", "model"))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_eval_fast_path_matches_torch_with_every_mask_kind(engine, norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, activation="gelu" if norm_first else "relu", batch_first=True,
                                       norm_first=norm_first).eval()
    device_layer = copy.deepcopy(layer).to("pjrt")
    x = torch.randn(4, 5, 16)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True], [False] * 5])
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    masks = [{}, {"src_key_padding_mask": padding}, {"src_mask": causal},
             {"src_mask": causal, "src_key_padding_mask": padding},
             {"src_mask": torch.zeros(5, 5).masked_fill(causal, float("-inf"))}]
    dev_x = xs.mark_sharding(x.to("pjrt"), _mesh(), ("data", None, None))
    with torch.no_grad():
        outs = [device_layer(dev_x, **{k: v.to("pjrt") for k, v in kw.items()}) for kw in masks]
        refs = [layer(x, **kw) for kw in masks]
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert_close(f"masks {sorted(masks[i])}", o.cpu(), r, rtol=1e-4, atol=1e-5)
    assert xs.metrics().fallbacks == 0


def test_multihead_attention_eval_fast_path_returns_output_and_averaged_weights(engine):
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    device_mha = copy.deepcopy(mha).to("pjrt")
    x = torch.randn(3, 6, 16)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[1, 4:] = True
    with torch.no_grad():
        out, weights = device_mha(*(x.to("pjrt"),) * 3, key_padding_mask=padding.to("pjrt"))
        ref_out, ref_weights = mha(x, x, x, key_padding_mask=padding)
    assert_close("output", out.cpu(), ref_out, rtol=1e-4, atol=1e-5)
    assert_close("weights", weights.cpu(), ref_weights, rtol=1e-4, atol=1e-5)


def test_embedding_bag_every_mode_and_its_gradients_match_torch(engine):
    torch.manual_seed(2)
    weight = torch.randn(10, 3)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    cases = []
    for mode in ("sum", "mean", "max"):
        for padding_idx in (None, 4):
            cases.append((mode, padding_idx, False, torch.tensor([0, 4, 4]), None))
            cases.append((mode, padding_idx, True, torch.tensor([0, 3, 3, 8]), None))
    cases.append(("sum", None, False, torch.tensor([0, 5]), torch.rand(8)))
    results = []
    for mode, padding_idx, last, offsets, psw in cases:
        pairs = []
        for dev in (False, True):
            w = (weight.to("pjrt") if dev else weight.clone()).requires_grad_()
            p = None if psw is None else (psw.to("pjrt") if dev else psw.clone()).requires_grad_()
            out = F.embedding_bag(indices.to("pjrt") if dev else indices, w, offsets.to("pjrt") if dev else offsets,
                                  mode=mode, padding_idx=padding_idx, include_last_offset=last, per_sample_weights=p)
            seed = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
            grads = torch.autograd.grad(out, [w] + ([p] if p is not None else []), seed.to("pjrt") if dev else seed)
            pairs.append([out, *grads])
        results.append((f"{mode} padding={padding_idx} last={last} weights={psw is not None}", pairs))
    for name, (ref, got) in results:
        for i, (r, g) in enumerate(zip(ref, got)):
            assert_close(f"{name}[{i}]", g.cpu(), r.detach(), rtol=1e-5, atol=1e-6)
    assert xs.metrics().fallbacks == 0


def test_vector_matrix_product_and_in_place_view_changes(engine):
    """``vec @ mat`` is ``unsqueeze(0).mm().squeeze_(0)``: an in-place op that changes the tensor's own shape."""
    torch.manual_seed(3)
    v, m = torch.randn(5), torch.randn(5, 3)
    dv = v.to("pjrt").requires_grad_()
    out = dv @ m.to("pjrt")
    (grad,) = torch.autograd.grad(out, dv, torch.ones(3).to("pjrt"))
    a = torch.randn(1, 4, 3).to("pjrt").clone()
    alias = a.view(1, 4, 3)
    a.squeeze_(0)
    a.t_()
    a.unsqueeze_(2)
    assert tuple(a.shape) == (3, 4, 1) and tuple(alias.shape) == (1, 4, 3)
    assert_close("vec @ mat", out.cpu(), v @ m)
    assert_close("grad", grad.cpu(), m.sum(1))
    assert_close("squeeze_ t_ unsqueeze_", a.cpu(), alias.cpu()[0].t().unsqueeze(2))


def test_channel_dropouts_and_alpha_dropout_draw_masks_with_the_right_structure(engine):
    """dropout2d/3d zero whole channels and scale the rest; alpha_dropout keeps mean 0 and variance 1."""
    torch.manual_seed(4)
    x = torch.ones(8, 16, 4, 4)
    y2 = F.dropout2d(x.to("pjrt"), 0.5, True).cpu()
    y3 = F.dropout3d(x.to("pjrt").unsqueeze(2), 0.25, True).cpu()
    z = F.alpha_dropout(torch.randn(64, 256).to("pjrt"), 0.3, True).cpu()
    for y, scale in ((y2, 2.0), (y3, 1 / 0.75)):
        per_channel = y.flatten(2)
        assert bool(((per_channel == 0).all(-1) | (per_channel == scale).all(-1)).all())
        assert 0.05 < float((per_channel[..., 0] == 0).float().mean()) < 0.7
    assert abs(float(z.mean())) < 0.1 and abs(float(z.std()) - 1) < 0.1


def test_empty_tensors_through_factories_reductions_and_shape_ops(engine):
    empty = torch.empty_permuted((0,), (0,), device="pjrt")
    x = torch.randn(3, 4)
    d = x.to("pjrt")
    cases = [
        ("empty_permuted", lambda t: torch.empty_permuted((0, 3), (1, 0), device=t.device) + 1),
        ("roll", lambda t: torch.roll(t[:0], 1, 0)),
        ("sum", lambda t: t[:0].sum(0)),
        ("prod", lambda t: t[:, :0].prod(1)),
        ("amax_keepdim", lambda t: t[:0].sum(0, keepdim=True)),
        ("cumsum", lambda t: t[:0].cumsum(0)),
        ("mm", lambda t: t[:, :0] @ t[:0, :]),
        ("cat", lambda t: torch.cat([t[:0], t[:1]])),
        ("index", lambda t: t[torch.tensor([], dtype=torch.long, device=t.device)]),
    ]
    outs = [(name, fn(d)) for name, fn in cases]
    assert tuple(empty.cpu().shape) == (0,)
    for (name, fn), (_, o) in zip(cases, outs):
        assert_close(name, o.cpu(), fn(x))


def _compare_with_grads(cases, grad_cases=()) -> None:
    """Run ``(name, fn, args)`` cases on pjrt and the CPU (gradients too for ``grad_cases``); one materialization."""
    results = []
    for name, fn, args in cases:
        with_grad = name in grad_cases
        pairs = []
        for dev in (False, True):
            moved = [(a.to("pjrt") if dev else a.clone()).requires_grad_(with_grad and a.is_floating_point())
                     for a in args]
            out = fn(*moved)
            outs = list(out) if isinstance(out, tuple) else [out]
            if with_grad:
                seed = torch.linspace(-1, 1, outs[0].numel()).reshape(outs[0].shape)
                outs += torch.autograd.grad(outs[0], [m for m in moved if m.requires_grad],
                                            seed.to("pjrt") if dev else seed)
            pairs.append(outs)
        results.append((name, pairs))
    for name, (ref, got) in results:
        for i, (r, g) in enumerate(zip(ref, got)):
            assert_close(f"{name}[{i}]", g.cpu(), r.detach(), rtol=1e-4, atol=1e-5)


def test_scans_order_statistics_and_searches_match_torch_with_nan_and_ties(engine):
    torch.manual_seed(5)
    x = torch.randn(4, 7)
    nan = x.clone()
    nan[1, 2] = nan[2, 0] = nan[2, 5] = float("nan")
    ties = torch.randint(0, 3, (4, 7)).float()
    seq = torch.sort(torch.randn(4, 6))[0]
    cases = []
    for tag, t in (("plain", x), ("nan", nan), ("ties", ties)):
        cases += [
            (f"cummax_{tag}", lambda a: torch.cummax(a, 1), [t]),
            (f"cummin_{tag}", lambda a: torch.cummin(a, 0), [t]),
            (f"logcumsumexp_{tag}", lambda a: torch.logcumsumexp(a, 1), [t]),
            (f"median_{tag}", torch.median, [t]),
            (f"nanmedian_{tag}", torch.nanmedian, [t]),
        ]
    for tag, t in (("plain", x), ("nan", nan)):  # ties make the index of a duplicate value arbitrary on the CPU
        cases += [
            (f"kthvalue_{tag}", lambda a: torch.kthvalue(a, 3, 1), [t]),
            (f"median_dim_{tag}", lambda a: torch.median(a, 1), [t]),
            (f"nanmedian_dim_{tag}", lambda a: torch.nanmedian(a, 1, keepdim=True), [t]),
        ]
    cases += [
        ("logcumsumexp_infinities", lambda a: torch.logcumsumexp(a, 0),
         [torch.tensor([float("-inf"), -1000.0, 0.0, float("inf"), 1.0])]),
        ("searchsorted", torch.searchsorted, [seq, torch.randn(4, 3)]),
        ("searchsorted_right_1d", lambda s, v: torch.searchsorted(s[0], v, right=True), [seq, seq[:, :2]]),
        ("bucketize", torch.bucketize, [torch.randn(4, 3), torch.sort(torch.randn(5))[0]]),
        ("histc_data_range", lambda a: torch.histc(a, 7), [torch.randn(50)]),
        ("histc", lambda a: torch.histc(a, 5, -1, 1), [torch.randn(50)]),
    ]
    _compare_with_grads(cases, {"cummax_plain", "logcumsumexp_plain", "median_dim_plain", "kthvalue_plain"})
    assert xs.metrics().fallbacks == 0


def test_bilinear_cdist_addbmm_masked_scatter_and_put_with_gradients_match_torch(engine):
    torch.manual_seed(6)
    mask = torch.rand(3, 4) > 0.5
    cases = [
        ("addbmm", lambda c, a, b: torch.addbmm(c, a, b, beta=0.5, alpha=2),
         [torch.randn(4, 6), torch.randn(3, 4, 5), torch.randn(3, 5, 6)]),
        ("bilinear", F.bilinear, [torch.randn(5, 3), torch.randn(5, 4), torch.randn(6, 3, 4), torch.randn(6)]),
        ("masked_scatter", lambda a, s: a.masked_scatter(mask.to(a.device), s), [torch.randn(3, 4), torch.randn(12)]),
        ("put", lambda a, s: a.put(torch.tensor([0, -1, 5]).to(a.device), s), [torch.randn(3, 4), torch.randn(3)]),
        ("put_accumulate", lambda a, s: a.put(torch.tensor([0, 0, 5]).to(a.device), s, accumulate=True),
         [torch.randn(3, 4), torch.randn(3)]),
    ]
    for p in (0.0, 1.0, 2.0, 3.0, 0.5, float("inf")):
        cases.append((f"cdist_p{p}", lambda a, b, p=p: torch.cdist(a, b, p), [torch.randn(2, 5, 3), torch.randn(2, 4, 3)]))
    _compare_with_grads(cases, {name for name, _, _ in cases if name != "cdist_p0.0"})
    assert xs.metrics().fallbacks == 0
