"""Random ops on the pjrt device: dropout statistics and determinism, and the plugin's RNG algorithm."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import _executor

from _exec_support import RngAlgorithm, engine, overriding  # noqa: F401


def _dropout_run(seed: int, p: float = 0.3) -> torch.Tensor:
    mesh = xs.Mesh(range(8), (2, 4))
    torch.manual_seed(seed)
    x = xs.mark_sharding(torch.ones(64, 128).to("pjrt"), mesh, (0, 1))
    return F.dropout(x, p, training=True).cpu()


def test_dropout_has_the_right_statistics(engine):
    p = 0.3
    y = _dropout_run(0, p)
    kept = y != 0
    frac = kept.float().mean().item()
    # 8192 Bernoulli(0.7) draws: the standard deviation of the kept fraction is about 0.005.
    assert abs(frac - (1 - p)) < 0.03, frac
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    # Every device's tile differs (no repeated key per shard).
    tiles = [kept[i * 32:(i + 1) * 32, j * 32:(j + 1) * 32] for i in range(2) for j in range(4)]
    assert all(not torch.equal(tiles[0], t) for t in tiles[1:])


def test_dropout_is_deterministic_under_a_fixed_seed(engine):
    a = _dropout_run(123)
    b = _dropout_run(123)
    c = _dropout_run(124)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_consecutive_steps_draw_different_numbers(engine):
    torch.manual_seed(5)
    x = torch.zeros(32, 32).to("pjrt")
    first = (x + torch.rand_like(x)).cpu()
    second = (x + torch.rand_like(x)).cpu()
    assert not torch.equal(first, second)
    torch.manual_seed(5)
    again = (x + torch.rand_like(x)).cpu()
    assert torch.equal(first, again)


def test_randn_and_bernoulli_statistics(engine):
    torch.manual_seed(9)
    x = torch.zeros(128, 128).to("pjrt")
    n = torch.randn_like(x).cpu()
    b = torch.bernoulli(torch.full((128, 128), 0.25).to("pjrt")).cpu()
    assert abs(n.mean().item()) < 0.03 and abs(n.std().item() - 1) < 0.03
    assert abs(b.mean().item() - 0.25) < 0.02
    assert set(b.unique().tolist()) <= {0.0, 1.0}


def test_rng_algorithm_follows_the_plugins_rng_default(engine):
    seen = {}
    for name, mlir in [("three_fry", "THREE_FRY"), ("philox", "PHILOX")]:
        with overriding(engine.plugin, RngAlgorithm(name)):
            assert engine.plugin.rng_default() == name
            y = _dropout_run(77)
            text = _executor.last_program().lowered.text
        assert f"algorithm = {mlir}" in text
        seen[name] = y
    # Same seed, different algorithm: different masks.
    assert not torch.equal(seen["three_fry"], seen["philox"])
    assert engine.plugin.rng_default() == "default"
    _dropout_run(77)
    assert "algorithm = DEFAULT" in _executor.last_program().lowered.text
