"""Random ops on the pjrt device: dropout statistics and determinism, the plugin's RNG algorithm, and keys drawn
per op from the device RNG state when the op is recorded (what fork_rng and checkpointing restore)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import execution
from pjrt_plugins.spmd import devices
from pjrt_plugins.spmd.trace import _materialize

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
            text = execution.last_program().lowered.text
        assert f"algorithm = {mlir}" in text
        seen[name] = y
    # Same seed, different algorithm: different masks.
    assert not torch.equal(seen["three_fry"], seen["philox"])
    assert engine.plugin.rng_default() == "default"
    _dropout_run(77)
    assert "algorithm = DEFAULT" in execution.last_program().lowered.text


def test_restoring_the_rng_state_repeats_the_draws_within_one_program(engine):
    """Each random op's numbers follow the device RNG state when it was recorded, not the program it runs in."""
    torch.manual_seed(11)
    x = torch.zeros(64).to("pjrt")
    state = torch.pjrt.get_rng_state()
    first = x + torch.rand_like(x)
    torch.pjrt.set_rng_state(state)
    again = x + torch.rand_like(x)
    third = x + torch.rand_like(x)
    with torch.random.fork_rng(device_type="pjrt"):
        forked = x + torch.rand_like(x)
    after_fork = x + torch.rand_like(x)
    xs.sync()  # one program for all five draws
    assert xs.metrics().executions == 1
    assert torch.equal(first.cpu(), again.cpu())
    assert not torch.equal(first.cpu(), third.cpu())
    assert torch.equal(forked.cpu(), after_fork.cpu())
    assert devices.rng_state() == (11, 3)  # offsets 0 (twice), 1, 2 (undone by fork_rng), 2


def test_two_draws_of_one_program_are_not_shifted_copies(engine):
    """Consecutive offsets are hashed into keys: rng_bit_generator counts from its state, so raw (seed, offset)
    states one apart give the same numbers shifted by a few elements (2 with THREE_FRY, 4 with PHILOX)."""
    for algorithm in ("three_fry", "philox"):
        with overriding(engine.plugin, RngAlgorithm(algorithm)):
            torch.manual_seed(12)
            x = torch.zeros(256).to("pjrt")
            a, b = (x + torch.rand_like(x)).cpu(), (x + torch.rand_like(x)).cpu()
        for shift in range(1, 9):
            assert not torch.equal(a[shift:], b[:-shift]), (algorithm, shift)
        assert (a == b).float().mean() < 0.01


def test_a_repeated_step_with_dropout_finds_its_program_and_draws_new_masks(engine, monkeypatch):
    """The per-op keys are inputs of the program, not constants in it or part of its key: a repeated step
    finds its traced program without building a graph, and still draws new masks."""
    built = []
    real_build = _materialize.build_graph
    monkeypatch.setattr(_materialize, "build_graph", lambda *a, **k: built.append(1) or real_build(*a, **k))
    torch.manual_seed(13)
    w = torch.ones(32, 32).to("pjrt").requires_grad_()
    masks = []
    for step in range(3):
        y = F.dropout(w * 2, p=0.5, training=True)
        y.sum().backward()
        with torch.no_grad():
            w -= 0.0 * w.grad
        w.grad = None
        xs.sync()
        masks.append(y.cpu() != 0)
        if step == 0:
            compiles, hits, graphs = xs.metrics().compiles, xs.metrics().cache_hits, len(built)
    assert xs.metrics().compiles == compiles, "a repeated step must not compile again"
    assert xs.metrics().cache_hits - hits == 2 and len(built) == graphs, "a repeated step must hit the trace cache"
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
