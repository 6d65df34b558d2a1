"""The device RNG stream: a ``(seed, offset)`` state that every random op draws its key from.

It follows ``torch.manual_seed`` (torch's initial seed), and torch saves and restores it through the
frontend's device module (``fork_rng``, checkpointing). Random numbers are made on the devices: a
program gets the key table of its random ops (:func:`rng_keys_tensor`) as an input.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "decode_rng_state",
    "encode_rng_state",
    "get_seed",
    "next_rng_key",
    "next_rng_keys",
    "rng_key_rows",
    "rng_keys_tensor",
    "rng_state",
    "set_rng_state",
    "set_seed",
]

_rng_lock = threading.Lock()
_rng_seed: int | None = None
_rng_offset = 0
_rng_seen_initial: int | None = None
_MASK64 = (1 << 64) - 1


def _sync_seed_locked() -> None:
    """Follow ``torch.manual_seed`` / ``torch.seed`` even when they did not reach us (a fresh process)."""
    global _rng_seed, _rng_offset, _rng_seen_initial
    initial = torch.initial_seed()
    if _rng_seed is None or initial != _rng_seen_initial:
        _rng_seed, _rng_offset, _rng_seen_initial = int(initial) & _MASK64, 0, initial


def set_seed(seed: int) -> None:
    """Restart the device RNG stream from ``seed`` (``torch.manual_seed`` calls this through the device module)."""
    global _rng_seed, _rng_offset, _rng_seen_initial
    with _rng_lock:
        _rng_seed, _rng_offset, _rng_seen_initial = int(seed) & _MASK64, 0, torch.initial_seed()


def get_seed() -> int | None:
    """The seed of the device RNG stream, or ``None`` before any seed reached it."""
    return _rng_seed


def rng_state() -> tuple[int, int]:
    """The device RNG state: ``(seed, offset)``, the key the next random draw uses."""
    with _rng_lock:
        _sync_seed_locked()
        assert _rng_seed is not None
        return _rng_seed, _rng_offset


def set_rng_state(seed: int, offset: int) -> None:
    """Make the next random draw use ``(seed, offset)`` again (``fork_rng`` and checkpointing restore states)."""
    global _rng_seed, _rng_offset, _rng_seen_initial
    with _rng_lock:
        _rng_seed, _rng_offset, _rng_seen_initial = int(seed) & _MASK64, int(offset) & _MASK64, torch.initial_seed()


def next_rng_key() -> tuple[int, int]:
    """The key ``(seed, offset)`` of the next random draw, and advance the offset."""
    global _rng_offset
    with _rng_lock:
        _sync_seed_locked()
        assert _rng_seed is not None
        key = (_rng_seed, _rng_offset)
        _rng_offset = (_rng_offset + 1) & _MASK64
        return key


def next_rng_keys(count: int) -> list[tuple[int, int]]:
    """The keys of the next ``count`` random draws (one per random op), advancing the offset past them."""
    global _rng_offset
    with _rng_lock:
        _sync_seed_locked()
        assert _rng_seed is not None
        first = _rng_offset
        _rng_offset = (_rng_offset + count) & _MASK64
        return [(_rng_seed, (first + i) & _MASK64) for i in range(count)]


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, a bijection of uint64 that scatters nearby inputs (wrapping arithmetic)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def rng_key_rows(keys: list[tuple[int, int]]) -> np.ndarray:
    """The generator states a program's random ops start from: ``uint64[len(keys), 2]``, row ``i`` for key ``i``.

    A row is ``(hash(seed, offset), 0)``: ``rng_bit_generator`` reads element 0 as its key and
    counts from element 1, so keys ``(seed, offset)`` and ``(seed, offset + 1)`` used as states
    directly would give the same numbers shifted by a few elements (2 with THREE_FRY, 4 with
    PHILOX); hashed, every op gets its own stream.
    """
    pairs = np.array(keys, dtype=np.uint64).reshape(-1, 2)
    rows = np.zeros_like(pairs)
    with np.errstate(over="ignore"):
        rows[:, 0] = _splitmix64(pairs[:, 0] ^ _splitmix64(pairs[:, 1]))
    return rows


def encode_rng_state(seed: int, offset: int) -> torch.Tensor:
    """The state as torch hands RNG states around: a CPU uint8 tensor (16 bytes: seed, offset)."""
    return torch.tensor([seed, offset], dtype=torch.uint64).view(torch.uint8)


def decode_rng_state(state: Any) -> tuple[int, int]:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        raise ValueError("a pjrt RNG state is the 16-byte uint8 tensor torch.pjrt.get_rng_state() returns, got "
                         f"{state!r:.80}")
    seed, offset = state.detach().cpu().contiguous().view(torch.uint64).tolist()
    return int(seed), int(offset)


def rng_keys_tensor(keys: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The ``uint64[n, 2]`` RNG key table of a program whose random ops drew ``keys`` ``(seed, offset)``."""
    return torch.from_numpy(rng_key_rows(list(keys)))

