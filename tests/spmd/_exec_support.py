"""Shared helpers for the lowering and execution tests: the 8-device CPU plugin, tracing, comparing.

Import fixtures from here into a test module (``from _exec_support import engine  # noqa: F401``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import pjrt_plugins
import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import execution
from pjrt_plugins.spmd import devices
from pjrt_plugins.spmd.sharding import OpSharding

MESH_SHAPE = (2, 4)
NUM_DEVICES = 8


def ensure_cpu8() -> Any:
    """pjrt:0 on the real CPU plugin with 8 devices, SPMD on (reusing the client when it already is)."""
    vd = devices.peek_virtual_device()
    if vd is None or vd.spmd is False or vd.num_devices != NUM_DEVICES or getattr(vd.plugin, "name", None) != "cpu":
        devices.set_spmd(True)
        xs.set_plugin("cpu", options={"cpu_device_count": NUM_DEVICES})
        vd = xs.virtual_device()
    return vd


@pytest.fixture
def engine() -> Any:
    """The 8-device CPU virtual device with the execution state reset (metrics, pending graph), strict: an op
    without a lowering raises instead of going through the CPU fallback (which is on again afterwards)."""
    vd = ensure_cpu8()
    xs.sync()
    xs.set_cpu_fallback(False)
    xs.reset_metrics()
    yield vd
    xs.set_cpu_fallback(True)


@pytest.fixture
def partitioner() -> Iterator[Callable[..., Any]]:
    """``xs.set_partitioner`` for the test; restores the switch and forgets probe answers and compiled programs
    after it."""
    yield xs.set_partitioner
    xs.set_partitioner(None)
    execution.reset_partitioner_probes()
    execution.clear_compile_cache()


def spec(*partition: Any, mesh_shape: Sequence[int] = MESH_SHAPE) -> OpSharding:
    """The sharding of a partition spec on a mesh over devices 0..7."""
    return OpSharding.from_partition_spec(tuple(mesh_shape), range(NUM_DEVICES), partition)


def trace(fn: Callable[..., Any], *args: torch.Tensor) -> torch.fx.GraphModule:
    """``fn`` as a graph of core ATen ops (make_fx with torch's core decompositions)."""
    return make_fx(fn, decomposition_table=core_aten_decompositions())(*args)


def run(fn: Callable[..., Any], args: Sequence[torch.Tensor], shardings: Sequence[Any] | None = None) -> tuple[list, Any]:
    """Trace ``fn``, run it sharded on the 8 devices; returns (outputs on the CPU, compiled program)."""
    gm = trace(fn, *args)
    return execution.run_graph(gm, list(args), shardings)


def assert_close(name: str, out: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Same shape and dtype; floats within ``rtol`` (relative to the reference's scale), others exact."""
    ref = ref.detach()
    assert tuple(out.shape) == tuple(ref.shape), f"{name}: shape {tuple(out.shape)} != torch's {tuple(ref.shape)}"
    assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != torch's {ref.dtype}"
    if ref.dtype.is_floating_point:
        o, r = out.double(), ref.double()
        same_nan = torch.equal(torch.isnan(o), torch.isnan(r))
        assert same_nan, f"{name}: NaN positions differ"
        finite = torch.isfinite(r)
        assert torch.equal(o[~finite & ~torch.isnan(r)], r[~finite & ~torch.isnan(r)]), f"{name}: infinities differ"
        err = (o[finite] - r[finite]).abs()
        bound = atol + rtol * r[finite].abs()
        if err.numel():
            worst = (err - bound).argmax()
            assert bool((err <= bound).all()), (
                f"{name}: max error {err.max().item():.3g} (at ref {r[finite][worst].item():.6g}, "
                f"got {o[finite][worst].item():.6g}) exceeds rtol={rtol} atol={atol}"
            )
    else:
        assert torch.equal(out, ref), f"{name}: values differ from torch"


def check_all(names: Sequence[str], outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor],
              tolerances: dict[str, tuple[float, float]] | None = None) -> None:
    """Compare every output with torch, naming the op of the first mismatch."""
    assert len(outs) == len(refs) == len(names)
    tolerances = tolerances or {}
    for name, o, r in zip(names, outs, refs):
        rtol, atol = tolerances.get(name, (1e-5, 1e-6))
        assert_close(name, o, r, rtol, atol)


class GatherFactor:
    """A site override of the dense-gather factor hook (layer it with :func:`overriding`)."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    @pjrt_plugins.hookimpl
    def pjrt_dense_gather_factor(self) -> int:
        return self.factor


class RngAlgorithm:
    """A site override of the RNG default hook (layer it with :func:`overriding`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @pjrt_plugins.hookimpl
    def pjrt_rng_default(self) -> str:
        return self.name


@contextlib.contextmanager
def overriding(plugin: Any, override: object) -> Iterator[None]:
    """``override`` layered over ``plugin`` for the block, removed afterwards."""
    handle = plugin.add_override(override)
    try:
        yield
    finally:
        plugin.remove_override(handle)


class Block(nn.Module):
    """A pre-norm causal transformer block, the layer of the tests' small GPTs."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        # No qkv bias: the key bias's gradient is zero up to rounding (softmax ignores a shift), and Adam
        # would blow that noise, which differs between any two backends, up to full steps.
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        att = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
