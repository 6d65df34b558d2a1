"""The pjrt-plugins demo: the installed PJRT plugins, the CPU plugin's 8 devices, and a sharded PyTorch training step.

    python examples/demo.py          (scripts/demo installs everything first, then runs this)

It trains a 2-layer MLP for a few SGD steps on a (2, 4) device mesh -- data parallel over
"data", Megatron-style model parallel over "model" -- and checks every result against the
same steps in plain PyTorch on the CPU. Exit status 0 when they agree, 1 when they do not.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins import cli

BATCH, WIDTH, HIDDEN, CLASSES = 32, 64, 256, 16
STEPS = 3
LR = 0.1
#: Largest acceptable difference from plain torch (float32; the sums run in a different order).
TOLERANCE = 1e-4


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = F.relu(self.fc1(x))
        return self.fc2(hidden), hidden


def train(model: MLP, x: torch.Tensor, y: torch.Tensor, steps: int, sync: bool) -> dict[str, torch.Tensor]:
    """``steps`` SGD steps; returns the last step's tensors (on the model's device)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(1, steps + 1):
        opt.zero_grad()
        out, hidden = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        if sync:
            xs.sync()  # PyTorch/XLA's mark_step: the whole step runs as one program on all devices
            print(f"  step {step}: loss {loss.item():.4f}")
    return {
        "x": x, "fc1.weight": model.fc1.weight, "fc1.bias": model.fc1.bias, "fc2.weight": model.fc2.weight,
        "fc2.bias": model.fc2.bias, "hidden": hidden, "out": out, "loss": loss,
        "fc1.weight.grad": model.fc1.weight.grad, "fc2.weight.grad": model.fc2.weight.grad,
    }


def heading(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 86 - len(text)))


def main() -> int:
    # The plugin's own C++ log lines are quiet by default (PJRT_PLUGINS_LOG_LEVEL=info shows them).
    heading("1. PJRT plugins installed here (python -m pjrt_plugins list)")
    cli.main(["list"])

    heading("2. The CPU plugin with 8 devices behind the torch device 'pjrt'")
    xs.set_plugin("cpu", options={"cpu_device_count": 8})  # or: CPU_NUM_DEVICES=8 PJRT_DEVICE=CPU
    vd = xs.virtual_device()
    client = vd.client
    major, minor = client.library.api_version
    print(f"{vd.plugin.name}: {vd.plugin.distribution} {vd.plugin.distribution_version}, "
          f"platform {client.platform_name} {client.platform_version}, PJRT C API {major}.{minor}")
    for ordinal, device in enumerate(vd.devices):
        print(f"  ordinal {ordinal}: {device!r}")
    print(f"torch sees one device, {xs.device()}, standing for all {vd.num_devices}")

    heading(f"3. A sharded MLP {WIDTH}-{HIDDEN}-{CLASSES}, batch {BATCH}, {STEPS} SGD steps on mesh (2, 4)")
    torch.manual_seed(0)
    cpu_model = MLP()
    x_cpu, y_cpu = torch.randn(BATCH, WIDTH), torch.randint(0, CLASSES, (BATCH,))
    model = copy.deepcopy(cpu_model).to("pjrt")  # nothing moves yet: the tensors wait on the host
    x, y = x_cpu.to("pjrt"), y_cpu.to("pjrt")

    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    xs.reset_transfer_counters()
    xs.reset_metrics()
    marks = {
        "x": (x, ("data", None)),                        # batch rows split over "data"
        "fc1.weight": (model.fc1.weight, ("model", None)),  # column-parallel first layer
        "fc1.bias": (model.fc1.bias, ("model",)),
        "fc2.weight": (model.fc2.weight, (None, "model")),  # row-parallel second layer
    }
    for name, (tensor, spec) in marks.items():
        xs.mark_sharding(tensor, mesh, spec)  # uploads each device's shard, nothing more
        print(f"  mark_sharding({name}, mesh, {spec})")
    marked_bytes = sum(t.nelement() * t.element_size() for t, _ in marks.values())
    print(f"uploaded to each device: {xs.transfer_counters().uploaded[0]:,} bytes "
          f"of the {marked_bytes:,} the four tensors hold")

    w1 = model.fc1.weight
    print(f"\nfc1.weight {tuple(w1.shape)}: a quarter per device ('model'), the same quarter on both 'data' rows")
    for shard in w1.local_shards:
        rows, cols = shard.indices
        print(f"  {shard.shard_device}: rows {rows.start}:{rows.stop}, cols {cols.start}:{cols.stop}, "
              f"shard shape {tuple(shard.data.shape)}, replica {shard.replica_id}")

    print("\nTraining (each step is traced, then run by xs.sync() on all 8 devices):")
    result = train(model, x, y, STEPS, sync=True)

    print("\nShardings after the last step (outputs: the SPMD partitioner's choice):")
    print(f"  {'tensor':<16} {'shape':<10} {'declared by':<14} sharding_spec")
    for name, t in result.items():
        origin = "mark_sharding" if t.partition_spec is not None else "partitioner"
        print(f"  {name:<16} {str(tuple(t.shape)):<10} {origin:<14} {t.sharding_spec}")

    print("\nBytes moved between host and devices (marking, the steps' inputs, local_shards, losses):")
    print(xs.transfer_counters().report())
    print("\nExecution metrics (one compile; the later steps reuse it):")
    print(xs.metrics_report())

    heading("4. Check against plain PyTorch on the CPU")
    expected = train(cpu_model, x_cpu, y_cpu, STEPS, sync=False)
    worst = 0.0
    for name, t in result.items():
        error = (t.detach().cpu() - expected[name].detach()).abs().max().item()
        worst = max(worst, error)
        print(f"  {name:<16} max abs error {error:.2e}")
    ok = worst <= TOLERANCE
    print(f"\n{'OK' if ok else 'FAILED'}: largest difference from plain torch {worst:.2e} "
          f"({'within' if ok else 'above'} {TOLERANCE:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
