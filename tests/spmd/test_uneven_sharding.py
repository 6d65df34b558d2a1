"""Unevenly tiled tensors (5 rows over 2 or 8 devices): identity programs run, and scatters never abort."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401

X = torch.arange(25.0).reshape(5, 5)


@pytest.mark.parametrize("name, fn", [
    ("clone", lambda t: t.clone()),
    ("transpose(0, 0)", lambda t: t.transpose(0, 0)),
    ("x + 0", lambda t: t + 0),
    ("x * 1", lambda t: t * 1),
])
def test_identity_programs_of_an_unevenly_tiled_tensor_run(engine, name, fn):
    # XLA compiles these for a replicated argument; the input is laid out again instead of failing.
    t = xs.mark_sharding(X.to("pjrt"), xs.Mesh(range(8), (2, 4)), (0, 1))
    assert_close(name, fn(t).cpu(), fn(X))
    assert_close(f"{name}, again (cached program)", fn(t).cpu(), fn(X))


CHILD = textwrap.dedent('''
    import torch, pjrt_plugins.spmd as xs
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    mesh = xs.Mesh(range(8), (8,))
    x, src = torch.zeros(5, 3), torch.arange(15.0).reshape(5, 3)
    idx2 = torch.tensor([[0, 1, 2], [4, 0, 1], [2, 2, 3], [1, 4, 0], [3, 3, 3]])
    idx = torch.tensor([0, 4, 2, 1, 3])
    cases = {
        "scatter_add": lambda x, i, i2, s: x.scatter_add(0, i2, s),
        "index_add": lambda x, i, i2, s: x.index_add(0, i, s),
        "index_copy": lambda x, i, i2, s: x.index_copy(0, i, s),
        "index_put": lambda x, i, i2, s: x.index_put((i,), s, accumulate=True),
    }
    for which in ("index", "src", "all"):
        for name, fn in cases.items():
            xd, i, i2, s = x.to("pjrt"), idx.to("pjrt"), idx2.to("pjrt"), src.to("pjrt")
            if which in ("index", "all"):
                xs.mark_sharding(i, mesh, (0,)); xs.mark_sharding(i2, mesh, (0, None))
            if which in ("src", "all"):
                xs.mark_sharding(s, mesh, (0, None))
            if which == "all":
                xs.mark_sharding(xd, mesh, (0, None))
            print(which, name, torch.equal(fn(xd, i, i2, s).cpu(), fn(x, idx, idx2, src)))
''')


def test_scatters_with_unevenly_tiled_operands_give_torchs_answer_in_a_surviving_process():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the process died ({proc.returncode}): {proc.stderr[-1500:]}"
    lines = proc.stdout.splitlines()
    assert len(lines) == 12 and all(line.endswith("True") for line in lines), proc.stdout
