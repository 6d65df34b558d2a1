"""CheckpointManager and resuming a killed run, with the real torch.distributed.checkpoint on 8 CPU devices.

The manager cases follow PyTorch/XLA's CheckpointManagerTest; the resume runs a training script in
subprocesses: one trains, saves and is killed with SIGKILL, a new one restores and continues, and the
losses must equal the uninterrupted run's bit for bit.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import CheckpointError, CheckpointMismatchError
from pjrt_plugins.spmd.distributed_checkpoint import CheckpointManager, _manager

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

TRAIN = Path(__file__).with_name("_checkpoint_train.py")
STEPS = 7


def sharded_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 3)).to("pjrt")
    mesh = xs.Mesh(range(8), (2, 4))
    xs.mark_sharding(model[0].weight, mesh, (1, 0))
    xs.mark_sharding(model[2].weight, mesh, (None, None))
    return model


def values(state_dict: dict) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in state_dict.items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def manager(path: Path, **kwargs) -> CheckpointManager:
    kwargs.setdefault("chkpt_on_preemption", False)
    return CheckpointManager(str(path), **kwargs)


def test_manager_saves_every_interval_and_restores(cpu8, tmp_path):
    mgr = manager(tmp_path, save_interval=10)
    state = sharded_model(1).state_dict()
    assert mgr.all_steps() == []
    for step in range(1, 10):
        assert not mgr.save(step, state)
    assert mgr.all_steps() == [] and list(tmp_path.iterdir()) == []
    for step in range(0, 40, 10):
        assert mgr.save(step, state)
    assert mgr.all_steps() == [0, 10, 20, 30]
    assert mgr.save(5, state, force=True) and mgr.all_steps() == [0, 5, 10, 20, 30]

    new = sharded_model(2).state_dict()
    assert not same(values(new), values(state))
    mgr.restore(30, new)
    assert same(values(new), values(state))
    assert new["0.weight"].sharding_spec == state["0.weight"].sharding_spec
    assert manager(tmp_path, save_interval=10).all_steps() == [0, 5, 10, 20, 30]  # found again from the disk


def test_a_relative_path_stays_where_it_was_when_the_directory_changes(cpu8, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mgr = CheckpointManager("runs", save_interval=1, chkpt_on_preemption=False)
    monkeypatch.chdir("/")
    state = sharded_model(1).state_dict()
    assert mgr.save(1, state) and (tmp_path / "runs" / "1" / ".manager_metadata").is_file()
    restored = sharded_model(2).state_dict()
    mgr.restore(1, restored)
    assert same(values(restored), values(state))


def test_max_to_keep_drops_the_oldest_by_time_and_persists(cpu8, tmp_path):
    mgr = manager(tmp_path, save_interval=10, max_to_keep=2)
    state = sharded_model().state_dict()
    assert mgr.save(10, state) and mgr.save(20, state) and mgr.all_steps() == [10, 20]
    assert mgr.save(30, state) and mgr.all_steps() == [20, 30]
    assert mgr.save(10, state) and mgr.all_steps() == [10, 30]  # the oldest is 20, though step 10 is smaller
    assert sorted(p.name for p in tmp_path.iterdir()) == ["10", "30"]
    mgr = manager(tmp_path, save_interval=10, max_to_keep=2)  # the order survives a new manager
    assert mgr.save(20, state) and mgr.all_steps() == [10, 20]


def test_save_async_writes_what_the_values_were_at_save_time(cpu8, tmp_path):
    mgr = manager(tmp_path, save_interval=10)
    model = sharded_model(1)
    at_save = values(model.state_dict())
    with mgr._save_mutex:  # hold the background writer until the values have changed
        assert mgr.save_async(10, model.state_dict())
        assert mgr.all_steps() == []
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(-3.0)
        xs.sync()
    mgr.join()
    assert mgr.all_steps() == [10]
    restored = sharded_model(2).state_dict()
    mgr.restore(10, restored)
    assert same(values(restored), at_save) and not same(values(model.state_dict()), at_save)


def test_async_steps_are_tracked_once_joined(cpu8, tmp_path):
    mgr = manager(tmp_path, save_interval=10, max_pending_async=2, num_of_threads=2)
    model = sharded_model(1)
    saved = {}
    for step in range(0, 60):
        if mgr.save_async(step, model.state_dict()):
            saved[step] = values(model.state_dict())
        if step % 10 == 5:
            with torch.no_grad():
                model[0].weight.add_(1.0)
    mgr.join()
    assert mgr.all_steps() == sorted(saved) == [0, 10, 20, 30, 40, 50]
    for step in (0, 30):
        restored = sharded_model(2).state_dict()
        mgr.restore(step, restored)
        assert same(values(restored), saved[step]), step


def test_an_incomplete_checkpoint_is_ignored_with_a_warning(cpu8, tmp_path, caplog):
    mgr = manager(tmp_path, save_interval=1)
    mgr.save(1, sharded_model().state_dict())
    (tmp_path / "2").mkdir()  # what a process killed while saving leaves: data without the marker
    (tmp_path / "2" / "__0_0.distcp").write_bytes(b"\0" * 64)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with caplog.at_level(logging.WARNING, logger=_manager.__name__):
        mgr = manager(tmp_path, save_interval=1)
    assert mgr.all_steps() == [1]
    assert "ignoring 1 incomplete or foreign checkpoint directory" in caplog.text and "2" in caplog.text
    with pytest.raises(CheckpointError, match=r"cannot restore step 2: the checkpoints under .* are of steps \[1\]"):
        mgr.restore(2, sharded_model().state_dict())


def test_a_failed_background_save_is_raised_by_join_and_not_tracked(cpu8, tmp_path):
    mgr = manager(tmp_path, save_interval=1)
    state = {"model": sharded_model().state_dict(), "schedule": lambda step: 0.1}  # cannot be pickled
    assert mgr.save_async(1, state)
    with pytest.raises(CheckpointError, match="the asynchronous save of step 1 failed") as caught:
        mgr.join()
    assert caught.value.__cause__ is not None
    assert mgr.all_steps() == []
    mgr.join()  # reported once


def test_restore_raises_clear_errors(cpu8, tmp_path):
    mgr = manager(tmp_path, save_interval=1)
    with pytest.raises(CheckpointError, match="cannot restore step 3: there is no complete checkpoint"):
        mgr.restore(3, {})
    mgr.save(3, {"model": sharded_model().state_dict()})
    wrong = {"model": torch.nn.Linear(16, 5).to("pjrt").state_dict()}
    with pytest.raises(CheckpointMismatchError, match=r"none of the state dict's 2 keys .* another model"):
        mgr.restore(3, wrong)
    with pytest.raises(ValueError, match="save_interval must be an integer > 0, got 0"):
        CheckpointManager(str(tmp_path), 0)
    with pytest.raises(ValueError, match="max_to_keep must be an integer >= 0, got -1"):
        CheckpointManager(str(tmp_path), 1, max_to_keep=-1)
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="is a file; give the CheckpointManager a directory"):
        manager(tmp_path / "file", save_interval=1)


def test_manager_works_with_a_gloo_process_group(cpu8, tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0)
    try:
        mgr = manager(tmp_path / "ckpt", save_interval=5, max_to_keep=1)
        assert mgr.pg is not None
        state = sharded_model(1).state_dict()
        assert mgr.save(5, state) and mgr.save_async(10, state)
        mgr.join()
        assert mgr.all_steps() == [10]
        restored = sharded_model(2).state_dict()
        mgr.restore(10, restored)
        assert same(values(restored), values(state))
    finally:
        dist.destroy_process_group()


def test_sigterm_asks_for_a_checkpoint_at_the_next_step(cpu8, tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    try:
        mgr = manager(tmp_path, save_interval=100, chkpt_on_preemption=True)
        state = sharded_model().state_dict()
        assert not mgr.reached_preemption(1) and not mgr.save(1, state)
        signal.raise_signal(signal.SIGTERM)  # the process goes on
        assert mgr.reached_preemption(2) and mgr.save(2, state) and mgr.all_steps() == [2]
    finally:
        signal.signal(signal.SIGTERM, previous)
        _manager._preempted.clear()
        _manager._sigterm_installed = False
    with pytest.raises(CheckpointError, match="preemption detection is off"):
        manager(tmp_path, save_interval=1).reached_preemption(1)


# -- a killed run resumes bit for bit ---------------------------------------------------------------


def _losses(text: str) -> dict[int, str]:
    return {int(step): value for step, value in re.findall(r"^loss (\d+) (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory) -> tuple[str, str]:
    """The output of a run that trains STEPS steps and is killed, and of a new process that resumes it twice."""
    root = tmp_path_factory.mktemp("killed")
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "XLA_USE_SPMD", "CPU_NUM_DEVICES")}
    env["PJRT_PLUGINS_CACHE_DIR"] = str(tmp_path_factory.mktemp("programs"))  # the resume reuses the programs
    train = subprocess.run([sys.executable, str(TRAIN), "train", str(root), str(STEPS)], capture_output=True,
                           text=True, timeout=600, env=env)
    assert train.returncode == -signal.SIGKILL, train.stdout[-2000:] + train.stderr[-3000:]
    resume = subprocess.run([sys.executable, str(TRAIN), "resume", str(root), str(STEPS)], capture_output=True,
                            text=True, timeout=600, env=env)
    assert resume.returncode == 0, resume.stdout[-2000:] + resume.stderr[-3000:]
    return train.stdout, resume.stdout


def test_a_killed_run_resumed_from_dcp_continues_bit_for_bit(killed_and_resumed):
    train, resume = killed_and_resumed
    uninterrupted = _losses(train)
    assert sorted(uninterrupted) == list(range(1, STEPS + 1))
    part = resume.split("resumed manager")[0]
    assert "resumed dcp 3" in part
    resumed = _losses(part)
    assert sorted(resumed) == list(range(4, STEPS + 1))
    assert resumed == {step: uninterrupted[step] for step in resumed}


def test_a_killed_run_resumed_from_async_manager_checkpoints_continues_bit_for_bit(killed_and_resumed):
    train, resume = killed_and_resumed
    uninterrupted = _losses(train)
    found = re.search(r"^resumed manager (\d+)$", resume, re.M)
    assert found, resume
    start = int(found.group(1))
    assert start in (4, 6)  # the save of step 6 may have been cut short by the kill; 4 was complete by then
    resumed = _losses(resume[found.end():])
    assert sorted(resumed) == list(range(start + 1, STEPS + 1))
    assert resumed == {step: uninterrupted[step] for step in resumed}
