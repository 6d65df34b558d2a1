"""FSDPv2 (SpmdFullyShardedDataParallel): what it does to parameters and outputs, auto-wrapping, the mesh
rules, and a small transformer trained with it on 8 devices following CPU eager torch step by step (wrapped
by hand, with an auto-wrap policy, and under torch.compile)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import ShardingError
from pjrt_plugins.spmd.fsdp_wrap import (
    always_wrap_policy,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from pjrt_plugins.spmd.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2
from pjrt_plugins.spmd.spmd_fully_sharded_data_parallel import parameter_partition_spec

from _exec_support import Block, assert_close, engine  # noqa: F401

STEPS = 3
ROW = "{devices=[8,1]0,1,2,3,4,5,6,7}"
COLUMN = "{devices=[1,8]0,1,2,3,4,5,6,7}"


def _mesh() -> xs.Mesh:
    return xs.Mesh(range(8), (8, 1), ("fsdp", "tensor"))


class SimpleLinear(nn.Module):
    """PyTorch/XLA's test model: fc1 (64x128) and fc2 (1x64)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, layers: int = 2, ctx: int = 8) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


@pytest.fixture(autouse=True)
def no_global_mesh():
    xs.set_global_mesh(None)
    yield
    xs.set_global_mesh(None)


def test_parameters_split_their_largest_dimension_and_outputs_their_batch(engine):
    torch.manual_seed(0)
    mesh = _mesh()
    ref = SimpleLinear()
    model = copy.deepcopy(ref).to("pjrt")
    model.fc1 = FSDPv2(model.fc1, mesh=mesh)
    model.fc2 = FSDPv2(model.fc2, mesh=mesh)
    model = FSDPv2(model, mesh=mesh)
    # PyTorch/XLA's expectations: both weights split along their longer dimension (128 and 64).
    assert model.fc1.weight.sharding_spec == COLUMN and model.fc2.weight.sharding_spec == COLUMN
    assert model.fc1.bias.sharding_spec == "{devices=[8]0,1,2,3,4,5,6,7}"
    assert model.fc2.bias.sharding_spec == "{devices=[8]0,1,2,3,4,5,6,7}"  # one element, unevenly split
    x = torch.randn(16, 128)
    out = model(xs.mark_sharding(x.to("pjrt"), mesh, ("fsdp", None)))
    assert out.sharding_spec == ROW  # marked at once, before it is computed
    assert_close("output", out.cpu(), ref(x))
    out.sum().backward()
    xs.sync()
    assert_close("fc1 grad", model.fc1.weight.grad.cpu(), torch.autograd.grad(ref(x).sum(), ref.fc1.weight)[0])
    assert model.module.fc1.module is model.fc1.module  # .module, and attributes forwarded to it


def test_the_mesh_comes_from_the_global_mesh_and_must_name_fsdp(engine):
    mesh = _mesh()
    with pytest.raises(ValueError, match="needs a mesh"):  # PyTorch/XLA raises ValueError here too
        FSDPv2(SimpleLinear())
    xs.set_global_mesh(mesh)
    model = FSDPv2(SimpleLinear())  # a CPU model is moved to pjrt
    assert model._mesh is mesh
    assert next(model.module.parameters()).device == xs.device()
    with pytest.raises(ShardingError, match="axis named 'fsdp'"):
        FSDPv2(SimpleLinear(), mesh=xs.Mesh(range(8), (8,), ("data",)))
    with pytest.raises(ValueError, match="The provided ddp axis is not in the mesh"):
        FSDPv2(SimpleLinear(), extra_data_axis="ddp")
    with pytest.raises(RuntimeError, match="already wrapped"):
        FSDPv2(model)
    with pytest.raises(RuntimeError, match="no forward method"):
        FSDPv2(nn.ModuleList([nn.Linear(2, 2)]), mesh=mesh)


def test_extra_data_axis_splits_the_output_batch_over_both_axes(engine):
    mesh = xs.Mesh(range(8), (2, 4, 1), ("data", "fsdp", "tensor"))
    model = FSDPv2(SimpleLinear(), mesh=mesh, extra_data_axis="data")
    # Parameters over "fsdp" only, replicated over "data" (PyTorch/XLA's multi-slice expectation).
    assert model.fc1.weight.sharding_spec == "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    x = xs.mark_sharding(torch.randn(16, 128).to("pjrt"), mesh, (("data", "fsdp"), None))
    assert model(x).sharding_spec == ROW


def test_auto_wrap_policies_wrap_the_picked_submodules(engine):
    mesh = _mesh()
    linear_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.Linear})
    model = FSDPv2(SimpleLinear(), mesh=mesh, auto_wrap_policy=linear_policy)
    assert isinstance(model.fc1, FSDPv2) and isinstance(model.fc2, FSDPv2)
    assert model.fc1.weight.sharding_spec == COLUMN

    untouched = FSDPv2(SimpleLinear(), mesh=mesh, auto_wrap_policy=linear_policy,
                       auto_wrapper_callable=lambda m, *args, **kwargs: m)
    assert not isinstance(untouched.fc1, FSDPv2) and untouched.fc1.weight.sharding_spec == COLUMN

    gpt = FSDPv2(TinyGPT(), mesh=mesh, auto_wrap_policy=functools.partial(
        lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, Block)))
    assert [type(b).__name__ for b in gpt.blocks] == ["SpmdFullyShardedDataParallel"] * 2
    assert not isinstance(gpt.head, FSDPv2)
    big = FSDPv2(TinyGPT(), mesh=mesh, auto_wrap_policy=functools.partial(size_based_auto_wrap_policy,
                                                                         min_num_params=10_000))
    # each block holds ~12.6k parameters: wrapped one by one; their Sequential keeps no more than 10k unwrapped
    assert all(isinstance(b, FSDPv2) for b in big.blocks) and not isinstance(big.blocks, FSDPv2)
    assert not isinstance(big.head, FSDPv2)
    everything = FSDPv2(SimpleLinear(), mesh=mesh, auto_wrap_policy=always_wrap_policy)
    assert isinstance(everything.fc2, FSDPv2)
    # torch's own policy (third parameter named nonwrapped_numel) works too: policies get positional arguments
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy as torch_policy

    torchs = FSDPv2(SimpleLinear(), mesh=mesh,
                    auto_wrap_policy=functools.partial(torch_policy, transformer_layer_cls={nn.Linear}))
    assert isinstance(torchs.fc1, FSDPv2)
    with pytest.raises(ValueError, match="already SpmdFullyShardedDataParallel"):
        inner = SimpleLinear()
        inner.fc1 = FSDPv2(inner.fc1, mesh=mesh)
        FSDPv2(inner, mesh=mesh, auto_wrap_policy=linear_policy)


def test_the_partition_spec_rule():
    assert parameter_partition_spec((64, 128), shard_maximal=True) == (None, "fsdp")
    assert parameter_partition_spec((128, 128), shard_maximal=True) == ("fsdp", None)  # the first largest
    assert parameter_partition_spec((16, 3, 5)) == ("fsdp", None, None)
    assert parameter_partition_spec((16, 3), "data") == (("data", "fsdp"), None)
    assert parameter_partition_spec(()) == ()


def _wrap_by_hand(model: TinyGPT, mesh: xs.Mesh) -> FSDPv2:
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FSDPv2(block, mesh=mesh)
    return FSDPv2(model, mesh=mesh)


def _wrap_by_policy(model: TinyGPT, mesh: xs.Mesh) -> FSDPv2:
    return FSDPv2(model, mesh=mesh,
                  auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}))


def _train_like_cpu(wrap, compile_model: bool = False) -> FSDPv2:
    torch.manual_seed(0)
    mesh = _mesh()
    ref = TinyGPT()
    model = wrap(copy.deepcopy(ref), mesh)
    for p in model.parameters():
        assert p.sharding_spec not in ("", "{replicated}"), "every parameter is split over fsdp"
    step_model = torch.compile(model, backend="pjrt") if compile_model else model
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        idx, target = torch.randint(0, 64, (8, 8)), torch.randint(0, 64, (8, 8))
        loss_ref = F.cross_entropy(ref(idx).flatten(0, 1), target.flatten())
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        idx_d = xs.mark_sharding(idx.to("pjrt"), mesh, ("fsdp", None))
        target_d = xs.mark_sharding(target.to("pjrt"), mesh, ("fsdp", None))
        loss = F.cross_entropy(step_model(idx_d).flatten(0, 1), target_d.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        assert_close(f"loss at step {step}", loss.cpu(), loss_ref.detach(), rtol=1e-4, atol=1e-5)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert_close(f"{name} after {STEPS} steps", p.cpu(), r.detach(), rtol=1e-4, atol=1e-5)
        assert p.sharding_spec == str(_mesh().get_op_sharding(parameter_partition_spec(p.shape, shard_maximal=True)))
    return model


def test_a_transformer_wrapped_by_hand_trains_like_cpu_eager(engine):
    _train_like_cpu(_wrap_by_hand)
    assert xs.metrics().fallbacks == 0


def test_a_transformer_wrapped_by_an_auto_wrap_policy_trains_like_cpu_eager(engine):
    model = _train_like_cpu(_wrap_by_policy)
    assert all(isinstance(b, FSDPv2) for b in model.blocks)


def test_a_compiled_fsdp_model_trains_like_cpu_eager(engine, fresh_dynamo):
    # The wrapper's forward (which marks the output) runs eagerly between the compiled graphs of the
    # wrapped modules, so no mark_sharding is ever traced.
    _train_like_cpu(_wrap_by_policy, compile_model=True)
