"""``aten._grouped_mm`` (mixture-of-experts layers) lowered natively, forward and backward, against torch's CPU kernel
and a loop over the groups, on the real CPU plugin's 8 devices.

``offs`` holds the cumulative ends of the groups: the rows of a 2d ``mat_a`` (2d x 3d, an MoE layer's forward), the
columns of a 2d ``mat_b`` (3d x 2d) or the contraction (2d x 2d, the experts' weight gradient); 3d x 3d is ``bmm``.
torch's CPU kernel takes float32, bfloat16 and float16 with 16-byte aligned strides, so the shapes here keep the
last dimensions multiples of 8.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine, run, spec  # noqa: F401

OFFS = torch.tensor([3, 3, 7, 12], dtype=torch.int32)  # four groups, the second empty


def grouped_mm_by_loop(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    """The definition, one matrix product per group (positions past the last end stay zero)."""
    if offs is None:
        return a @ b
    start, ends = 0, offs.tolist()
    if a.dim() == 2 and b.dim() == 3:
        out = a.new_zeros(a.shape[0], b.shape[2])
        for g, end in enumerate(ends):
            out[start:end] = a[start:end] @ b[g]
            start = end
    elif a.dim() == 3 and b.dim() == 2:
        out = a.new_zeros(a.shape[1], b.shape[1])
        for g, end in enumerate(ends):
            out[:, start:end] = a[g] @ b[:, start:end]
            start = end
    else:
        out = a.new_zeros(len(ends), a.shape[0], b.shape[1])
        for g, end in enumerate(ends):
            out[g] = a[:, start:end] @ b[start:end]
            start = end
    return out


def _operands(combination: str, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(mat_a, mat_b, offs) of one operand combination; the grouped dimension has 12 positions."""
    g = len(OFFS)
    shapes = {"2d x 3d": ((12, 16), (g, 16, 8)), "3d x 2d": ((g, 8, 16), (16, 12)),
              "2d x 2d": ((8, 12), (12, 16)), "3d x 3d": ((g, 8, 16), (g, 16, 8))}[combination]
    a, b = (torch.randn(s, dtype=dtype) for s in shapes)
    return a, b, None if combination == "3d x 3d" else OFFS.clone()


COMBINATIONS = ["2d x 3d", "3d x 2d", "2d x 2d", "3d x 3d"]


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_each_operand_combination_matches_the_cpu_kernel_and_the_loop(engine, combination):
    torch.manual_seed(0)
    a, b, offs = _operands(combination)
    args = [a, b] if offs is None else [a, b, offs]
    # Rows of mat_a over the mesh's first axis, the last dimension of mat_b over its second.
    shardings = [spec(0, None) if a.dim() == 2 else spec(None, 0, None),
                 spec(None, 1) if b.dim() == 2 else spec(None, None, 1), None][:len(args)]
    outs, program = run(lambda *t: torch._grouped_mm(t[0], t[1], offs=t[2] if len(t) > 2 else None), args, shardings)
    reference = torch._grouped_mm(a, b, offs=offs)
    assert_close(combination, outs[0], reference, rtol=1e-5, atol=1e-5)
    assert_close(f"{combination} (loop)", outs[0], grouped_mm_by_loop(a, b, offs), rtol=1e-5, atol=1e-5)
    assert "aten._grouped_mm.default" in program.lowered.ops


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_each_operand_combination_differentiates_natively(engine, combination):
    """torch's backward of _grouped_mm is two more _grouped_mm calls on transposed operands: no fallback."""
    torch.manual_seed(1)
    a, b, offs = _operands(combination)
    a_cpu, b_cpu = a.clone().requires_grad_(), b.clone().requires_grad_()
    expected = torch._grouped_mm(a_cpu, b_cpu, offs=offs)
    grad = torch.randn(expected.shape)
    expected_grads = torch.autograd.grad(expected, [a_cpu, b_cpu], grad)

    a_dev, b_dev = a.to("pjrt").requires_grad_(), b.to("pjrt").requires_grad_()
    out = torch._grouped_mm(a_dev, b_dev, offs=None if offs is None else offs.to("pjrt"))
    grads = torch.autograd.grad(out, [a_dev, b_dev], grad.to("pjrt"))
    assert_close(combination, out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    for name, g, e in zip(("mat_a's gradient", "mat_b's gradient"), grads, expected_grads):
        assert_close(f"{combination}: {name}", g.cpu(), e, rtol=1e-5, atol=1e-5)
    assert xs.metrics().fallbacks == 0  # the fixture refuses the fallback: any would have raised


def test_rows_past_the_last_end_are_zero_and_an_empty_group_adds_nothing(engine):
    """torch leaves the rows past ``offs[-1]`` unwritten (uninitialized); the pjrt device gives zeros there."""
    torch.manual_seed(2)
    a, b = torch.randn(12, 16), torch.randn(3, 16, 8)
    offs = torch.tensor([4, 4, 9], dtype=torch.int32)
    out = torch._grouped_mm(a.to("pjrt"), b.to("pjrt"), offs=offs.to("pjrt")).cpu()
    assert_close("grouped rows", out[:9], torch._grouped_mm(a, b, offs=offs)[:9], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[9:], torch.zeros(3, 8))


def test_an_inf_in_one_expert_reaches_only_its_own_rows(engine):
    """Every group's product is computed for every row, but each row keeps only its own group's (a select,
    not a multiplication by zero, which would turn another expert's inf into NaN)."""
    torch.manual_seed(3)
    a, b = torch.randn(12, 16), torch.randn(4, 16, 8)
    b[2, 0, 0] = float("inf")
    a_grad = torch.randn(8, 12)  # 2d x 2d: the weight gradient's form
    b_grad = torch.randn(12, 16)
    b_grad[0, 0] = float("nan")  # a position of the first group
    out = torch._grouped_mm(a.to("pjrt"), b.to("pjrt"), offs=OFFS.to("pjrt")).cpu()
    assert_close("forward with inf", out, torch._grouped_mm(a, b, offs=OFFS), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out[:3]).all() and torch.isfinite(out[7:]).all()
    wgrad = torch._grouped_mm(a_grad.to("pjrt"), b_grad.to("pjrt"), offs=OFFS.to("pjrt")).cpu()
    assert torch.isnan(wgrad[0]).any() and torch.isfinite(wgrad[1:]).all()
    assert_close("weight gradient with nan", wgrad, torch._grouped_mm(a_grad, b_grad, offs=OFFS), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_types_accumulate_in_float32_and_round_once(engine, dtype):
    torch.manual_seed(4)
    a, b, offs = _operands("2d x 3d", dtype)
    out = torch._grouped_mm(a.to("pjrt"), b.to("pjrt"), offs=offs.to("pjrt")).cpu()
    assert out.dtype == dtype
    exact = grouped_mm_by_loop(a.float(), b.float(), offs).to(dtype)  # float32 products rounded once
    assert_close(f"{dtype}", out, exact, rtol=0, atol=0)
    assert_close(f"{dtype} against the CPU kernel", out, torch._grouped_mm(a, b, offs=offs), rtol=1e-2, atol=1e-2)


def test_experts_sharded_over_the_mesh_expert_parallel(engine):
    """The experts' weights split over devices (the group dimension), tokens over the other mesh axis."""
    torch.manual_seed(5)
    a, b = torch.randn(16, 16), torch.randn(4, 16, 8)
    offs = torch.tensor([5, 6, 13, 16], dtype=torch.int32)
    outs, _ = run(lambda x, w, o: torch._grouped_mm(x, w, offs=o), [a, b, offs], [spec(0, None), spec(1, None, None),
                                                                                  None])
    assert_close("expert parallel", outs[0], torch._grouped_mm(a, b, offs=offs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case, message", [
    (lambda: (torch.randn(8, 16, dtype=torch.float64), torch.randn(2, 16, 8, dtype=torch.float64),
              torch.tensor([4, 8], dtype=torch.int32), {}), "float32, bfloat16 or float16"),
    (lambda: (torch.randn(8, 16), torch.randn(2, 16, 8), torch.tensor([4, 8]), {}), "int32"),
    (lambda: (torch.randn(8, 16), torch.randn(2, 16, 8), None, {}), "offs"),
    (lambda: (torch.randn(8, 16), torch.randn(2, 8, 8), torch.tensor([4, 8], dtype=torch.int32), {}), "contraction"),
    (lambda: (torch.randn(8, 16), torch.randn(3, 16, 8), torch.tensor([4, 8], dtype=torch.int32), {}), "offsets"),
    (lambda: (torch.randn(8, 16), torch.randn(2, 16, 8), torch.tensor([4, 8], dtype=torch.int32),
              {"bias": torch.randn(2, 8)}), "bias"),
], ids=["float64", "int64 offs", "no offs", "contraction", "group count", "bias"])
def test_calls_the_cpu_kernel_refuses_are_refused_with_the_reason(engine, case, message):
    a, b, offs, kwargs = case()
    with pytest.raises(RuntimeError):
        torch._grouped_mm(a, b, offs=offs, **kwargs)  # torch's CPU kernel refuses it too
    moved = {k: v.to("pjrt") for k, v in kwargs.items()}
    with pytest.raises(RuntimeError, match=message):
        torch._grouped_mm(a.to("pjrt"), b.to("pjrt"), offs=None if offs is None else offs.to("pjrt"), **moved)


class GroupedExperts(nn.Module):
    """A top-2 mixture-of-experts layer routed as transformers' default ``grouped_mm`` experts path is: tokens sorted
    by expert, group ends from ``histc`` and ``cumsum``, one ``_grouped_mm`` per projection."""

    def __init__(self, hidden: int = 16, ffn: int = 32, experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * ffn, hidden) * 0.2)
        self.down = nn.Parameter(torch.randn(experts, hidden, ffn) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.topk(self.router(x).softmax(-1), self.top_k)
        expert_ids, order = torch.sort(chosen.reshape(-1))
        tokens = order // self.top_k
        counts = torch.histc(expert_ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gate, up = torch._grouped_mm(x[tokens], self.gate_up.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, self.down.transpose(-2, -1), offs=offs)
        y = y * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add(0, tokens, y)


def test_a_mixture_of_experts_layer_trains_without_the_cpu_fallback(engine):
    """Three SGD steps of the layer on the device match the CPU's, and record no fallback (the fixture refuses it)."""
    torch.manual_seed(7)
    cpu_layer = GroupedExperts()
    dev_layer = GroupedExperts().to("pjrt")
    dev_layer.load_state_dict({k: v.to("pjrt") for k, v in cpu_layer.state_dict().items()})
    batches = [torch.randn(12, 16) for _ in range(3)]
    for layer, device in ((cpu_layer, "cpu"), (dev_layer, "pjrt")):
        opt = torch.optim.SGD(layer.parameters(), lr=0.5)
        for x in batches:
            layer(x.to(device)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    xs.sync()
    for (name, expected), actual in zip(cpu_layer.state_dict().items(), dev_layer.state_dict().values()):
        assert_close(name, actual.cpu(), expected, rtol=1e-4, atol=1e-5)
    assert xs.metrics().fallbacks == 0


# -- OpInfo-style samples, through the OpInfo sweep's own comparison (forward and input gradients vs the CPU) -------

SWEEP = Path(__file__).resolve().parents[2] / "scripts" / "opinfo_sweep.py"


def _sweep_module():
    if "opinfo_sweep" not in sys.modules:
        loader_spec = importlib.util.spec_from_file_location("opinfo_sweep", SWEEP)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules["opinfo_sweep"] = module  # its dataclasses look their module up by name
        loader_spec.loader.exec_module(module)
    return sys.modules["opinfo_sweep"]


def _sample_inputs(combination: str):
    """torch's op_db has no OpInfo for _grouped_mm: its samples, as an OpInfo's sample_inputs_func."""

    def sample_inputs(op_info, device, dtype, requires_grad, **kwargs):
        from torch.testing._internal.opinfo.core import SampleInput

        torch.manual_seed(6)
        for ends in ([3, 3, 7, 12], [12, 12, 12, 12], [1, 2, 3, 12]):  # an empty group; all in one; uneven
            offs = torch.tensor(ends, dtype=torch.int32)
            a, b, _ = _operands(combination, dtype)
            a, b = a.to(device).requires_grad_(requires_grad), b.to(device).requires_grad_(requires_grad)
            yield SampleInput(a, args=(b,), kwargs={} if combination == "3d x 3d" else {"offs": offs})

    return sample_inputs


def _grouped_mm_opinfo(combination: str):
    from torch.testing._internal.opinfo.core import OpInfo

    return OpInfo("_grouped_mm", variant_test_name=combination.replace(" ", ""), op=torch._grouped_mm,
                  dtypes=(torch.float32, torch.bfloat16, torch.float16), sample_inputs_func=_sample_inputs(combination),
                  supports_out=False, supports_autograd=True)


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_opinfo_style_samples_pass_natively_forward_and_backward(combination):
    sweep = _sweep_module()
    opinfo = _grouped_mm_opinfo(combination)
    key = sweep.op_key(opinfo)
    result = sweep.check_op(key, sweep.Device(), {key: opinfo})
    assert (result.forward, result.backward) == ("pass", "pass"), (result.forward_detail, result.backward_detail,
                                                                   result.fallback_ops)
