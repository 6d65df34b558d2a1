"""The gpu backend on a real NVIDIA GPU: client, buffers, programs, allocator options, SPMD and torch.compile.

These need the CUDA PJRT plugin (jax-cuda13-pjrt or jax-cuda12-pjrt) and a visible GPU. CI has
no GPU, so there they are skipped with that reason; docs/backends.md ("Checked on a GPU") says
where and when they last ran. The tests of the backend that need no GPU are in test_gpu.py.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import pjrt_plugins
from pjrt_plugins.conform._programs import ADD_F32, TWO_OUTPUTS


def _gpu_ready() -> str | None:
    """Why these tests cannot run here, or None."""
    plugin = pjrt_plugins.get_plugin("gpu")
    reason = plugin.unavailable_reason()
    if reason:
        return reason
    from pjrt_plugin_gpu._plugin import gpu_count

    return None if gpu_count() > 0 else "no NVIDIA GPU is visible"


_WHY_NOT = _gpu_ready()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"needs an NVIDIA GPU: {_WHY_NOT}")

#: Create options for every client of these tests: grow memory as needed, so that the tests
#: (and a torch or jax beside them) share the GPU.
SHARED_GPU = {"preallocate": False}

MATMUL_F32 = """
module @matmul {
  func.func public @main(%a: tensor<256x512xf32>, %b: tensor<512x128xf32>) -> tensor<256x128xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0],
        precision = [HIGHEST, HIGHEST] : (tensor<256x512xf32>, tensor<512x128xf32>) -> tensor<256x128xf32>
    return %0 : tensor<256x128xf32>
  }
}
"""


@pytest.fixture(scope="module")
def client():
    with pjrt_plugins.create_client("gpu", SHARED_GPU) as gpu_client:
        yield gpu_client


def test_client_reports_the_cuda_platform_and_each_gpu(client):
    assert client.platform_name == "cuda"
    devices = client.addressable_devices
    from pjrt_plugin_gpu._plugin import gpu_count

    assert len(devices) == gpu_count()
    for ordinal, device in enumerate(devices):
        assert device.local_hardware_id == ordinal
        attributes = device.attributes
        assert attributes["compute_capability"].count(".") == 1, attributes
        assert device.default_memory.kind == "device"
        assert {"device", "pinned_host"} <= {memory.kind for memory in device.memories}


@pytest.mark.parametrize(
    "dtype",
    [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_, np.complex64],
    ids=lambda d: np.dtype(d).name,
)
def test_buffers_round_trip_every_dtype(client, dtype):
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((3, 5, 7)) * 10).astype(dtype)
    buffer = client.buffer_from_host(data, device=client.addressable_devices[-1])
    back = buffer.to_numpy()
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, data)


def test_a_large_buffer_round_trips(client):
    data = np.arange(64 * 1024 * 1024, dtype=np.float32)  # 256 MiB
    back = client.buffer_from_host(data).to_numpy()
    assert back[0] == 0 and back[-1] == data[-1]
    np.testing.assert_array_equal(back[:: 1 << 16], data[:: 1 << 16])


def test_programs_compile_and_run(client):
    add = client.compile(ADD_F32)
    a = client.buffer_from_host(np.ones(4, np.float32))
    b = client.buffer_from_host(np.arange(4, dtype=np.float32))
    [[out]] = add.execute([[a, b]])
    np.testing.assert_array_equal(out.to_numpy(), [1, 2, 3, 4])

    two = client.compile(TWO_OUTPUTS)
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    [[doubled, total]] = two.execute([[client.buffer_from_host(x)]])
    np.testing.assert_array_equal(doubled.to_numpy(), x * 2)
    assert int(total.to_numpy()) == 15


def test_matmul_at_highest_precision_matches_float64(client):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 128)).astype(np.float32)
    program = client.compile(MATMUL_F32)
    [[out]] = program.execute([[client.buffer_from_host(a), client.buffer_from_host(b)]])
    expected = a.astype(np.float64) @ b.astype(np.float64)
    # float32 accumulation: TF32 would be off by about 1e-2 here.
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=0, atol=1e-3)


def test_memory_statistics_follow_a_buffer_and_memories_are_described(client):
    device = client.addressable_devices[0]
    before = device.get_memory_info()
    assert before["bytes_limit"] > 0 and before["peak_bytes_used"] >= before["bytes_used"] >= 0
    held = client.buffer_from_host(np.zeros(16 * 1024 * 1024, np.float32), device)  # 64 MiB
    after = device.get_memory_info()
    assert after["bytes_used"] >= before["bytes_used"] + (64 << 20), (before, after)
    assert "bytes_in_use" in device.memory_stats()
    del held
    kinds = [description.kind for description in device.memory_descriptions]
    assert kinds and kinds[0] == device.default_memory.kind, kinds


def test_a_step_on_the_gpu_is_traced_by_the_plugins_profiler(client, tmp_path):
    from jax.profiler import ProfileData

    from pjrt_plugins import profiler

    rng = np.random.default_rng(2)
    program = client.compile(MATMUL_F32)
    a = client.buffer_from_host(rng.standard_normal((256, 512)).astype(np.float32))
    b = client.buffer_from_host(rng.standard_normal((512, 128)).astype(np.float32))
    with profiler.trace(tmp_path, client) as result:
        for _ in range(3):
            program.execute([[a, b]])[0][0].to_numpy()
    assert result.events > 0, "the CUDA plugin's profiler recorded no event of three matmuls"
    assert ProfileData.from_file(str(result.xplane_path)).planes


def test_many_launches_without_waiting_all_finish(client):
    add = client.compile(ADD_F32)
    one = client.buffer_from_host(np.ones(4, np.float32))
    total = client.buffer_from_host(np.zeros(4, np.float32))
    for _ in range(2000):
        [[total]] = add.execute([[total, one]], wait=False)
    np.testing.assert_array_equal(total.to_numpy(), [2000] * 4)


def _run(code: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "options",
    [
        {"allocator": "platform"},
        {"allocator": "cuda_async", "preallocate": False},
        {"allocator": "bfc", "preallocate": True, "memory_fraction": 0.2},
    ],
    ids=["platform", "cuda_async", "bfc-fraction"],
)
def test_allocator_options_are_accepted_and_run(options):
    result = _run(
        f"""
        import numpy as np, pjrt_plugins
        from pjrt_plugins.conform._programs import ADD_F32
        with pjrt_plugins.create_client("gpu", {options!r}) as client:
            [[out]] = client.compile(ADD_F32).execute(
                [[client.buffer_from_host(np.ones(4, np.float32)), client.buffer_from_host(np.ones(4, np.float32))]])
            print(out.to_numpy().tolist())
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == "[2.0, 2.0, 2.0, 2.0]"


def test_allocator_environment_reaches_the_plugin():
    # PJRT_ALLOCATOR_FRACTION is PyTorch/XLA's variable; the backend maps it to memory_fraction.
    result = _run(
        """
        import os
        os.environ.update(PJRT_ALLOCATOR_FRACTION="0.25", PJRT_ALLOCATOR_PREALLOCATE="false")
        import pjrt_plugins
        gpu = pjrt_plugins.get_plugin("gpu")
        print(sorted(gpu.client_create_options().items()))
        with gpu.create_client() as client:
            print(client.platform_name)
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "('memory_fraction', 0.25)" in lines[0] and "('preallocate', False)" in lines[0]
    assert lines[1] == "cuda"


def test_a_mistyped_option_is_a_python_error_naming_it():
    with pytest.raises(TypeError, match="memory_fraction"):
        pjrt_plugins.create_client("gpu", {"memory_fraction": "half"})
    with pytest.raises(ValueError, match="Did you mean 'preallocate'"):
        pjrt_plugins.create_client("gpu", {"prealocate": False})


# -- SPMD and torch on the GPU -------------------------------------------------------------

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture(scope="module")
def gpu_mesh():
    import pjrt_plugins.spmd as xs

    xs.set_plugin("gpu", options=SHARED_GPU)
    count = xs.virtual_device().num_devices
    yield xs, xs.Mesh(range(count), (count,), ("data",))
    xs.set_plugin(None)


def _adamw_losses(net, loss_of, steps, lr, sync):
    """The losses of ``steps`` AdamW steps on ``net``; ``sync`` (``xs.sync`` or None) ends each step."""
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of()
        loss.backward()
        opt.step()
        if sync is not None:
            sync()
        losses.append(loss.item())
    return losses


def test_sharded_training_matches_torch_on_the_cpu(gpu_mesh):
    xs, mesh = gpu_mesh
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    model = copy.deepcopy(cpu_model).to("pjrt")
    x_cpu, y_cpu = torch.randn(16, 32), torch.randint(0, 8, (16,))
    x, y = x_cpu.to("pjrt"), y_cpu.to("pjrt")
    xs.mark_sharding(x, mesh, ("data", None))

    def train(net, inputs, labels, sync):
        return _adamw_losses(net, lambda: nn.functional.cross_entropy(net(inputs), labels), 5, 1e-2,
                             xs.sync if sync else None)

    ours = train(model, x, y, sync=True)
    expected = train(cpu_model, x_cpu, y_cpu, sync=False)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)
    assert ours[-1] < ours[0]
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().numpy(), atol=1e-4)


def test_torch_compile_backend_runs_on_the_gpu(gpu_mesh):
    xs, mesh = gpu_mesh
    torch.manual_seed(1)
    cpu_model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4))
    model = copy.deepcopy(cpu_model).to("pjrt")
    compiled = torch.compile(model, backend="pjrt")
    x_cpu = torch.randn(8, 16)
    x = x_cpu.to("pjrt")
    xs.mark_sharding(x, mesh, ("data", None))
    for _ in range(3):
        out = compiled(x)
        xs.sync()
    np.testing.assert_allclose(out.detach().cpu().numpy(), cpu_model(x_cpu).detach().numpy(), atol=1e-5)


def test_float32_products_follow_torchs_matmul_precision(gpu_mesh):
    # "highest" (torch's default) is float32; "medium" lets XLA use TF32 on the GPU, like torch's
    # own allow_tf32. The error against float64 shows which one ran.
    xs, _ = gpu_mesh
    torch.manual_seed(2)
    a, b = torch.randn(256, 1024), torch.randn(1024, 256)
    exact = a.double() @ b.double()
    before = torch.get_float32_matmul_precision()
    errors = {}
    try:
        for setting in ("highest", "medium"):
            torch.set_float32_matmul_precision(setting)
            product = (a.to("pjrt") @ b.to("pjrt")).cpu()
            errors[setting] = (product.double() - exact).abs().max().item()
    finally:
        torch.set_float32_matmul_precision(before)
    assert errors["highest"] < 1e-3, errors
    assert errors["medium"] > 10 * errors["highest"], errors


class TinyGPT(nn.Module):
    """Embeddings, one pre-norm block (causal SDPA, GELU MLP), final norm and head."""

    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, length: int = 16):
        super().__init__()
        self.heads = heads
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.norm1, self.norm2, self.norm_out = nn.LayerNorm(width), nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        batch, length = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, -1))
        x = x + self.mlp(self.norm2(x))
        return self.head(self.norm_out(x))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_a_small_gpt_trains_like_torch_on_the_cpu(gpu_mesh, compiled):
    xs, mesh = gpu_mesh
    torch.manual_seed(3)
    cpu_model = TinyGPT()
    model = copy.deepcopy(cpu_model).to("pjrt")
    ids_cpu = torch.randint(0, 64, (4, 16))
    ids = ids_cpu.to("pjrt")
    xs.mark_sharding(ids, mesh, ("data", None))

    def train(net, inputs, sync):
        step = torch.compile(net, backend="pjrt") if sync and compiled else net

        def loss():
            logits = step(inputs)
            return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), inputs[:, 1:].reshape(-1))

        return _adamw_losses(net, loss, 4, 3e-3, xs.sync if sync else None)

    ours = train(model, ids, sync=True)
    expected = train(cpu_model, ids_cpu, sync=False)
    np.testing.assert_allclose(ours, expected, rtol=1e-4)
    assert ours[-1] < ours[0]


def test_dropout_draws_fresh_masks_on_the_gpu(gpu_mesh):
    xs, _ = gpu_mesh
    ones = torch.ones(256, 256).to("pjrt")
    first = nn.functional.dropout(ones, 0.25).cpu()
    second = nn.functional.dropout(ones, 0.25).cpu()
    for mask in (first, second):
        assert torch.all((mask == 0) | torch.isclose(mask, torch.tensor(1 / 0.75)))
        assert abs((mask == 0).float().mean().item() - 0.25) < 0.02
    assert not torch.equal(first, second)
