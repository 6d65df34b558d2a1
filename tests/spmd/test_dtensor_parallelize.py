"""PyTorch's own DTensor API on the pjrt mesh: torch's distribute_tensor, distribute_module, DTensor.from_local and
parallelize_module's tensor-parallel styles become XLA shardings, and models trained with them match CPU eager."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.tensor as torch_dtensor
import torch.nn.functional as F
from _dtensor_support import Block, Llama, block_plan, gloo, mesh2x4, mesh8, parallelize_llama, train_both  # noqa: F401
from _exec_support import ensure_cpu8
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import PlacementError


def _capture_outputs(model: nn.Module, names: list[str], into: dict[str, torch.Tensor]) -> None:
    """Keep the latest output of each named submodule in ``into`` (after every hook: as laid out for the next module)."""
    for name in names:
        model.get_submodule(name).register_forward_hook(lambda m, i, o, name=name: into.__setitem__(name, o))


def _spec(mesh_shape: tuple, names: tuple, *partition) -> str:
    return str(xs.Mesh(range(8), mesh_shape, names).get_op_sharding(partition))


# -- torch's functions on a pjrt mesh ---------------------------------------------------------------------------


def test_torchs_distribute_tensor_lays_out_a_pjrt_tensor(mesh2x4):
    full = torch.randn(8, 12)
    t = torch_dtensor.distribute_tensor(full, mesh2x4, [Shard(1), Shard(0)])
    assert isinstance(t, xs.XLAShardedTensor) and not isinstance(t, DTensor)  # as torch returns for xla meshes
    assert t.placements == (Shard(1), Shard(0)) and t.sharding_spec == _spec((2, 4), ("dp", "tp"), "tp", "dp")
    assert torch.equal(t.cpu(), full)
    default = torch_dtensor.distribute_tensor(torch.randn(3), mesh2x4, src_data_rank=None)
    assert default.placements == (Replicate(), Replicate()) and default.sharding_spec == "{replicated}"
    with pytest.raises(RuntimeError, match="should be used to distribute leaf tensors"):
        torch_dtensor.distribute_tensor(torch.randn(4, requires_grad=True) * 2, mesh2x4, [Shard(0), Replicate()])


def test_torchs_dtensor_factories_make_the_whole_tensor_laid_out(mesh8):
    zeros = torch_dtensor.zeros(8, 4, device_mesh=mesh8, placements=[Shard(0)])
    full = torch_dtensor.full((8, 4), 2.5, device_mesh=mesh8, placements=[Shard(1)], requires_grad=True)
    noise = torch_dtensor.randn(16, 2, device_mesh=mesh8)
    assert zeros.shape == (8, 4) and zeros.placements == (Shard(0),) and zeros.sum().item() == 0
    assert full.is_leaf and full.requires_grad and full.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    assert torch.equal(full.detach().cpu(), torch.full((8, 4), 2.5))
    assert noise.placements == (Replicate(),) and noise.cpu().std() > 0.1
    with pytest.raises(PlacementError, match="does not have"):
        torch_dtensor.ones(4, device_mesh=mesh8, placements=[Shard(1)])


def test_a_distribute_tensor_bound_before_the_routes_says_what_to_do(mesh8):
    torchs_own = torch_dtensor.distribute_tensor.__wrapped__  # what `from torch... import` bound earlier holds
    with pytest.raises(PlacementError, match="import pjrt_plugins.spmd.dtensor first"):
        torchs_own(torch.randn(8, 2), mesh8, [Shard(0)])


def test_torchs_distribute_module_partitions_replicates_and_hooks(mesh8):
    calls = []

    def partition_fn(name, module, mesh):  # written as for CUDA: replace the parameter with the distributed one
        if isinstance(module, nn.Linear):
            module.register_parameter("weight", nn.Parameter(torch_dtensor.distribute_tensor(module.weight, mesh,
                                                                                              [Shard(0)])))

    model = torch_dtensor.distribute_module(
        nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8)), mesh8, partition_fn,
        input_fn=lambda mod, inputs, mesh: calls.append("in"),
        output_fn=lambda mod, outputs, mesh: calls.append("out"))
    assert model[0].weight.placements == (Shard(0),) and model[0].bias.placements == (Replicate(),)
    assert model[1].weight.placements == (Replicate(),)
    model(torch.randn(2, 4).to("pjrt"))
    assert calls == ["in", "out"]
    with pytest.raises(RuntimeError, match="only be called once"):
        torch_dtensor.distribute_module(model, mesh8)


def test_from_local_takes_the_whole_tensor_on_pjrt_and_stays_torchs_elsewhere(mesh8, gloo):
    x = torch.randn(4, 16)
    on_pjrt = DTensor.from_local(x, mesh8, [Shard(1)])
    assert isinstance(on_pjrt, xs.XLAShardedTensor) and on_pjrt.shape == x.shape  # no per-rank pieces to join
    assert on_pjrt.placements == (Shard(1),)
    xs.sync()
    assert on_pjrt.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}" and torch.equal(on_pjrt.cpu(), x)
    with pytest.raises(PlacementError, match="takes the whole tensor"):
        DTensor.from_local(x, mesh8, [Shard(0)], shape=(32, 16), stride=(16, 1))
    on_cpu = DTensor.from_local(x, init_device_mesh("cpu", (1,)), [Shard(0)])
    assert type(on_cpu) is DTensor and on_cpu.placements == (Shard(0),)


def test_styles_on_other_meshes_stay_torchs(gloo):
    model = parallelize_module(nn.Sequential(nn.Linear(4, 8)), init_device_mesh("cpu", (1,)), {"0": ColwiseParallel()})
    assert type(model[0].weight) is DTensor and model[0].weight.placements == (Shard(0),)


# -- parallelize_module ------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


def test_a_megatron_mlp_trains_like_cpu_eager_with_activations_laid_out_by_the_plan(mesh8):
    torch.manual_seed(0)
    batches = [(torch.randn(4, 8, 16), torch.randn(4, 8, 16)) for _ in range(4)]
    outputs: dict[str, torch.Tensor] = {}

    def shard(model: nn.Module) -> nn.Module:
        parallelize_module(model, mesh8, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        _capture_outputs(model, ["w1", "w2"], outputs)
        return model

    cpu_losses, pjrt_losses, model = train_both(MLP(), shard, batches, lambda net, x, y: F.mse_loss(net(x), y))
    assert pjrt_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert (model.w1.weight.placements, model.w1.bias.placements) == ((Shard(0),), (Shard(0),))
    assert (model.w2.weight.placements, model.w2.bias.placements) == ((Shard(1),), (Replicate(),))
    assert model.w1.weight.sharding_spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    # Column-parallel output sharded on its last dimension, row-parallel output replicated (the all-reduce).
    assert outputs["w1"].sharding_spec == "{devices=[1,1,8]0,1,2,3,4,5,6,7}"
    assert outputs["w2"].sharding_spec == "{replicated}"


def test_a_megatron_mlp_on_a_tensor_parallel_sub_mesh_keeps_the_batch_split(mesh2x4, gloo):
    # Data x tensor parallel in one program: the plan on mesh["tp"], the batch marked over "dp".
    torch.manual_seed(3)
    batches = [(torch.randn(4, 8, 16), torch.randn(4, 8, 16)) for _ in range(3)]
    mesh = xs.Mesh(range(8), (2, 4), ("dp", "tp"))
    outputs: dict[str, torch.Tensor] = {}

    def shard(model: nn.Module) -> nn.Module:
        parallelize_module(model, mesh2x4["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        _capture_outputs(model, ["w1"], outputs)
        return model

    def loss_fn(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.device.type == "pjrt":
            xs.mark_sharding(x, mesh, ("dp", None, None))
        return F.mse_loss(net(x), y)

    cpu_losses, pjrt_losses, model = train_both(MLP(), shard, batches, loss_fn)
    assert pjrt_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert model.w1.weight.sharding_spec == _spec((2, 4), ("dp", "tp"), "tp", None)  # replicated over "dp"
    assert model.w1.weight.placements == (Shard(0),)  # relative to the sub-mesh it was given
    # The hidden activation: batch over "dp", features over "tp" (the partitioner's propagation).
    assert outputs["w1"].sharding_spec == _spec((2, 4), ("dp", "tp"), "dp", None, "tp")


def test_a_transformer_block_trains_like_cpu_eager(mesh8):
    torch.manual_seed(1)
    seq, dim, n_heads = 8, 32, 8
    head = dim // n_heads
    angles = torch.outer(torch.arange(seq).float(), 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head)))
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    batches = [(torch.randn(2, seq, dim), torch.randn(2, seq, dim)) for _ in range(3)]
    outputs: dict[str, torch.Tensor] = {}

    def shard(model: nn.Module) -> nn.Module:
        parallelize_module(model, mesh8, block_plan())
        _capture_outputs(model, ["attention_norm", "attention.wq", "attention.wo", "feed_forward.w1"], outputs)
        return model

    def loss_fn(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(net(x, (cos.to(x.device), sin.to(x.device))), y)

    cpu_losses, pjrt_losses, model = train_both(Block(dim, n_heads, 64), shard, batches, loss_fn)
    assert pjrt_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert model.attention.wq.weight.sharding_spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert model.feed_forward.w2.weight.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    # Sequence-parallel norm output split along the sequence; q and the FFN hidden by heads / features;
    # the row-parallel wo back to sequence shards (a reduce-scatter).
    assert outputs["attention_norm"].sharding_spec == "{devices=[1,8,1]0,1,2,3,4,5,6,7}"
    assert outputs["attention.wq"].sharding_spec == "{devices=[1,1,8]0,1,2,3,4,5,6,7}"
    assert outputs["feed_forward.w1"].sharding_spec == "{devices=[1,1,8]0,1,2,3,4,5,6,7}"
    assert outputs["attention.wo"].sharding_spec == "{devices=[1,8,1]0,1,2,3,4,5,6,7}"


def test_a_llama_with_torchtitans_plan_trains_like_cpu_eager(mesh8):
    torch.manual_seed(2)
    batches = [(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))) for _ in range(3)]

    def loss_fn(net: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(tokens).flatten(0, 1), targets.flatten())

    cpu_losses, pjrt_losses, model = train_both(Llama(), lambda m: parallelize_llama(m, mesh8), batches, loss_fn,
                                                lr=0.5)
    assert pjrt_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert cpu_losses[-1] < cpu_losses[0]  # it learns: the comparison is over a moving model
    layer = model.layers[0]
    assert model.tok_embeddings.weight.placements == (Shard(0),) and model.output.weight.placements == (Shard(0),)
    assert layer.attention.wo.weight.placements == (Shard(1),) and layer.ffn_norm.weight.placements == (Replicate(),)


def test_prepare_module_input_output_lay_out_args_kwargs_and_outputs(mesh8):
    class Pair(nn.Module):
        def forward(self, a, b=None, *, scale=None):
            return a + 1, b * scale

    module = parallelize_module(Pair(), mesh8, PrepareModuleInputOutput(
        input_layouts=(Replicate(), None), desired_input_layouts=(Shard(0), None),
        input_kwarg_layouts={"scale": Replicate()}, desired_input_kwarg_layouts={"scale": Shard(1)},
        output_layouts=(Shard(0), Replicate()), desired_output_layouts=(Replicate(), Shard(1))))
    seen = {}
    module.register_forward_pre_hook(lambda m, args, kwargs: seen.update(a=args[0], scale=kwargs["scale"]),
                                     with_kwargs=True)
    a, b, scale = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)
    out_a, out_b = module(a.to("pjrt"), b.to("pjrt"), scale=scale.to("pjrt"))
    xs.sync()
    assert seen["a"].placements == (Shard(0),) and seen["scale"].placements == (Shard(1),)
    assert out_a.placements == (Replicate(),) and out_b.placements == (Shard(1),)
    assert out_b.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(out_a.cpu(), a + 1)
    torch.testing.assert_close(out_b.cpu(), b * scale)
    with pytest.raises(ValueError, match="inputs and input_layouts should have same length"):
        parallelize_module(nn.Identity(), mesh8, PrepareModuleInput(input_layouts=(Shard(0), Shard(0)),
                                                                    desired_input_layouts=(Replicate(), Replicate())))(
            torch.randn(8, 2).to("pjrt"))
    with pytest.raises(ValueError, match="outputs and output_layouts should have same length"):
        parallelize_module(nn.Identity(), mesh8, PrepareModuleOutput(output_layouts=(Shard(0), Shard(0)),
                                                                     desired_output_layouts=(Shard(0), Shard(0))))(
            torch.randn(8, 2).to("pjrt"))


def test_sequence_parallel_lays_the_sequence_dimension_out(mesh8):
    norm = parallelize_module(nn.LayerNorm(16).to("pjrt"), mesh8, SequenceParallel(sequence_dim=0))
    x = torch.randn(8, 16)
    out = norm(x.to("pjrt"))
    xs.sync()
    assert norm.weight.placements == (Replicate(),) and out.placements == (Shard(0),)
    assert out.sharding_spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(out.cpu(), F.layer_norm(x, (16,), norm.weight.cpu(), norm.bias.cpu()))


def test_plans_that_do_not_fit_fail_before_xla_sees_them(mesh2x4, mesh8):
    ensure_cpu8()
    cases = [
        # A style's one placement on a 2-D mesh: a mesh dimension no placement names.
        (lambda: parallelize_module(MLP(), mesh2x4, {"w1": ColwiseParallel()}), PlacementError,
         r"1 placement .* for a mesh of 2 dimensions"),
        (lambda: parallelize_module(MLP(), DeviceMesh("pjrt", list(range(4)), _init_backend=False, _rank=0),
                                    {"w1": ColwiseParallel()}), PlacementError, "covers 4 devices"),
        (lambda: parallelize_module(nn.Sequential(nn.LayerNorm(4)), mesh8, {"0": ColwiseParallel()}),
         NotImplementedError, "only support nn.Linear and nn.Embedding"),
        (lambda: parallelize_module(nn.LayerNorm(16), mesh8, SequenceParallel(sequence_dim=2))(
            torch.randn(2, 16).to("pjrt")), PlacementError, "does not have"),
        (lambda: parallelize_module(MLP(), mesh8, {"w1": RowwiseParallel(output_layouts=Shard(2))})(
            torch.randn(2, 16).to("pjrt")), PlacementError, "does not have"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    xs.sync()  # nothing half-recorded is left behind


def test_a_style_subclass_with_its_own_hooks_is_refused_not_ignored(mesh8):
    class ScaledOutput(ColwiseParallel):
        @staticmethod
        def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
            return outputs * 2

    class Labelled(RowwiseParallel):  # no hook of its own: routed like RowwiseParallel
        pass

    with pytest.raises(NotImplementedError, match="ScaledOutput overrides _prepare_output_fn of ColwiseParallel"):
        parallelize_module(MLP(), mesh8, {"w1": ScaledOutput()})
    assert parallelize_module(MLP(), mesh8, {"w2": Labelled()}).w2.weight.placements == (Shard(1),)


def test_a_style_applied_twice_to_one_module_is_refused_as_torch_does(mesh8):
    model = parallelize_module(MLP(), mesh8, {"w1": ColwiseParallel()})
    with pytest.raises(RuntimeError, match="only be called once"):
        parallelize_module(model, mesh8, {"w1": ColwiseParallel()})
