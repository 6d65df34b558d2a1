"""The virtual device pjrt:0 in torch's own idiom: .to("pjrt"), module.to, factories, copies, autograd, dispatch."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import VirtualDeviceError
from pjrt_plugins.spmd import devices
from pjrt_plugins.spmd.frontend import _seam, unwrap
from pjrt_plugins.spmd.transport import TensorState


def test_pjrt_is_a_torch_device():
    assert xs.device() == torch.device("pjrt", 0)
    assert torch._C._get_privateuse1_backend_name() == "pjrt"
    assert torch.pjrt.device_count() == 1 and torch.pjrt.is_available()
    assert torch.randn(2).pjrt().device.type == "pjrt"  # torch's generated Tensor.pjrt()


def test_to_pjrt_makes_a_deferred_copy(cpu8):
    t = torch.arange(12.0).reshape(3, 4)
    p = t.to("pjrt")
    assert isinstance(p, xs.XLAShardedTensor)
    assert (p.shape, p.dtype, p.device) == (t.shape, t.dtype, torch.device("pjrt:0"))
    assert unwrap(p).state is TensorState.HOST
    t.add_(100)  # the copy was taken at .to(): later writes to t do not leak in
    assert torch.equal(p.cpu(), torch.arange(12.0).reshape(3, 4))
    assert xs.transfer_counters().uploads == 0
    assert xs.to_device(t).device == xs.device()


def test_module_to_pjrt_moves_parameters_and_buffers(cpu8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    assert xs.to_device(model) is model
    for name, param in model.named_parameters():
        assert isinstance(param, xs.XLAShardedTensor) and isinstance(param, torch.nn.Parameter), name
        assert param.requires_grad and param.is_leaf
    for name, buf in model.named_buffers():
        assert isinstance(buf, xs.XLAShardedTensor), name
    for key, value in model.state_dict().items():
        assert torch.equal(value.cpu(), expected[key]), key
    assert xs.transfer_counters().uploads == 0
    model.to("cpu")
    assert all(p.device.type == "cpu" and type(p) is torch.nn.Parameter for p in model.parameters())
    assert torch.equal(model[0].weight, expected["0.weight"])


def test_factory_functions_on_pjrt(cpu8):
    z = torch.zeros(2, 3, device="pjrt")
    o = torch.ones(4, device="pjrt", dtype=torch.int64)
    f = torch.full((2, 2), 7.5, device="pjrt")
    e = torch.empty(5, 5, device="pjrt", dtype=torch.bfloat16)
    t = torch.tensor([[1, 2], [3, 4]], device="pjrt")
    for x in (z, o, f, e, t):
        assert isinstance(x, xs.XLAShardedTensor) and x.device == xs.device()
    assert torch.equal(z.cpu(), torch.zeros(2, 3))
    assert torch.equal(o.cpu(), torch.ones(4, dtype=torch.int64))
    assert torch.equal(f.cpu(), torch.full((2, 2), 7.5))
    assert e.shape == (5, 5) and e.dtype == torch.bfloat16
    assert t.tolist() == [[1, 2], [3, 4]]
    assert torch.empty_like(z).shape == (2, 3) and z.new_empty((7,)).device == xs.device()
    # contents nobody wrote are flagged, so the engine need not upload them before overwriting
    assert unwrap(e).uninitialized and unwrap(torch.empty_like(z)).uninitialized
    assert not unwrap(z).uninitialized and not unwrap(f).uninitialized and not unwrap(t).uninitialized
    assert xs.transfer_counters().uploads == 0


def test_only_pjrt_index_zero_exists(cpu8):
    with pytest.raises(VirtualDeviceError, match="pjrt:0"):
        torch.zeros(2, device="pjrt:1")


def test_copies_between_cpu_and_pjrt(cpu8):
    p = torch.zeros(2, 3).to("pjrt")
    p.copy_(torch.arange(3.0))  # broadcasting copy from the CPU
    assert torch.equal(p.cpu(), torch.arange(3.0).expand(2, 3))
    out = torch.empty(2, 3, dtype=torch.float64)
    out.copy_(p)  # copy from pjrt into a CPU tensor, with a dtype change
    assert torch.equal(out, torch.arange(3.0, dtype=torch.float64).expand(2, 3))
    assert torch.equal(p.to("cpu", torch.int32), torch.arange(3, dtype=torch.int32).expand(2, 3))
    q = p.to(torch.float16)  # deferred data converts on the host
    assert q.dtype == torch.float16 and torch.equal(q.cpu(), torch.arange(3.0).expand(2, 3).half())
    assert p.clone().cpu().equal(p.cpu())
    assert p.to("meta").device.type == "meta"


def test_copy_into_marked_tensor_keeps_its_annotation(cpu8):
    p = torch.zeros(8, 2).to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(8), (8,)), (0, None))
    spec = p.sharding_spec
    p.copy_(torch.ones(8, 2))
    assert p.sharding_spec == spec
    assert torch.equal(p.cpu(), torch.ones(8, 2))
    assert [s.data.tolist() for s in p.local_shards] == [[[1.0, 1.0]]] * 8


def test_item_tolist_repr(cpu8):
    p = torch.tensor([[1.5, 2.0], [3.0, 4.0]]).to("pjrt")
    assert torch.tensor(2.5).to("pjrt").item() == 2.5
    assert p.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    text = repr(p)
    assert text.startswith("XLAShardedTensor([[1.5000, 2.0000]") and "device='pjrt:0'" in text
    xs.mark_sharding(p, xs.Mesh(range(8), (2, 4)), (0, 1))
    assert "sharding='{devices=[2,4]0,1,2,3,4,5,6,7}'" in repr(p)
    assert str(p) == repr(p)
    assert "requires_grad=True" in repr(torch.nn.Parameter(torch.ones(2).to("pjrt")))


def test_setting_data_swaps_the_value(cpu8):
    param = torch.nn.Parameter(torch.zeros(3).to("pjrt"))
    param.data = torch.ones(3).to("pjrt")
    assert torch.equal(param.cpu(), torch.ones(3))
    assert torch.equal(param.data.cpu(), torch.ones(3))
    with pytest.raises(VirtualDeviceError, match="move it with .to"):
        param.data = torch.zeros(3)


def test_detach_aliases_the_same_data(cpu8):
    p = torch.zeros(4).to("pjrt")
    d = p.detach()
    d.fill_(2.0)
    assert torch.equal(p.cpu(), torch.full((4,), 2.0))
    xs.mark_sharding(d, xs.Mesh(range(8), (8,)), (None,))
    assert p.sharding_spec == "{replicated}"


def test_deepcopy_of_a_module_on_pjrt(cpu8):
    model = torch.nn.Linear(3, 2).to("pjrt")
    xs.mark_sharding(model.weight, xs.Mesh(range(8), (2, 4)), (0, None))
    clone = copy.deepcopy(model)
    assert clone.weight is not model.weight
    assert isinstance(clone.weight, torch.nn.Parameter) and clone.weight.requires_grad
    assert torch.equal(clone.weight.cpu(), model.weight.cpu())
    assert clone.weight.sharding_spec == model.weight.sharding_spec
    clone.weight.data = torch.zeros(2, 3).to("pjrt")
    assert not torch.equal(model.weight.cpu(), torch.zeros(2, 3))


def test_manual_seed_reaches_the_device():
    torch.manual_seed(1234)
    assert devices.get_seed() == 1234


def test_other_operators_go_to_the_execution_engine(cpu8, monkeypatch):
    calls = []
    sentinel = xs.XLAShardedTensor(torch.zeros(3))

    def fake_dispatch(func, types_, args, kwargs):
        calls.append((func, args, kwargs))
        return sentinel

    fake_engine = types.SimpleNamespace(dispatch=fake_dispatch, materialize=lambda datas: None)
    monkeypatch.setattr(_seam, "_engine", fake_engine)
    p = torch.ones(3).to("pjrt")
    assert torch.ops.aten.add.Tensor(p, p) is sentinel
    func, args, _ = calls[0]
    assert func is torch.ops.aten.add.Tensor and args[0] is p
    # data-model operators never reach the engine
    p.detach()
    p.cpu()
    assert len(calls) == 1


def test_an_operator_nobody_handles_raises_naming_it_when_strict(cpu8):
    p = torch.eye(3).to("pjrt")
    xs.set_cpu_fallback(False)
    try:
        with pytest.raises(NotImplementedError, match="svd"):
            torch.linalg.svdvals(p).cpu()
    finally:
        xs.set_cpu_fallback(True)


def test_without_jaxlib_the_first_operator_says_what_to_install():
    # A process where jaxlib cannot be imported (an install without the [spmd] extra's jaxlib): making,
    # moving and marking tensors works; the first operator needs the engine and says what is missing.
    script = textwrap.dedent(
        """
        import sys, importlib.abc
        class NoJaxlib(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "jaxlib" or name.startswith("jaxlib."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NoJaxlib())
        import torch, pjrt_plugins.spmd as xs
        xs.set_plugin("cpu", options={"cpu_device_count": 2})
        t = torch.ones(2).to("pjrt")
        try:
            t + 1
        except ImportError as exc:
            print("ImportError:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "ImportError: running operators on the pjrt device needs jaxlib" in out.stdout, out.stderr[-2000:]
    assert "pjrt-plugins[spmd]" in out.stdout


def test_autograd_through_a_pjrt_parameter_does_not_abort():
    # Brief section 7: without a device guard this aborts the process; so it runs in a child.
    script = textwrap.dedent(
        """
        import torch, pjrt_plugins.spmd as xs
        xs.set_plugin("cpu", options={"cpu_device_count": 2})
        w = torch.nn.Parameter(torch.arange(3.0).to("pjrt"))
        loss = (w.to("cpu") * torch.tensor([1.0, 2.0, 3.0])).sum()
        loss.backward()
        assert isinstance(w.grad, xs.XLAShardedTensor), type(w.grad)
        assert w.grad.tolist() == [1.0, 2.0, 3.0]
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_USE_SPMD"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_torch_save_and_load_a_sharded_state_dict(cpu8):
    import io

    mesh = xs.Mesh(range(8), (2, 4))
    model = torch.nn.Linear(4, 2).to("pjrt")
    xs.mark_sharding(model.weight, mesh, (0, None))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert all(isinstance(v, xs.XLAShardedTensor) for v in state.values())
    other = torch.nn.Linear(4, 2).to("pjrt")
    xs.mark_sharding(other.weight, mesh, (0, None))
    other.load_state_dict(state)  # copies into the marked parameter, which keeps its sharding
    assert torch.equal(other.weight.cpu(), model.weight.cpu())
    assert other.weight.sharding_spec == model.weight.sharding_spec


def test_module_to_keeps_tied_parameters_tied(cpu8):
    """A weight shared by two modules (embedding and LM head) stays one Parameter, as on the CPU and CUDA."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    grad = torch.ones(10, 4)
    emb.weight.grad = grad.clone()
    moved = model.to("pjrt")
    assert moved is model
    assert model.head.weight is model.emb.weight
    assert isinstance(model.emb.weight, torch.nn.Parameter) and model.emb.weight.device.type == "pjrt"
    assert len(list(model.parameters())) == 1
    assert model.emb.weight.grad.device.type == "pjrt" and torch.equal(model.emb.weight.grad.cpu(), grad)
