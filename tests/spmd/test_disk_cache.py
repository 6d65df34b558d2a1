"""The cache directory: executables reused across processes only under their full key, in a private directory."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import CompileCacheWarning
from pjrt_plugins.spmd.execution import _disk_cache

from _exec_support import engine, run  # noqa: F401

STEP = """
import json, torch
import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd.execution import _disk_cache
xs.set_plugin("cpu", options={"cpu_device_count": 8})
mesh = xs.Mesh(range(8), (2, 4))
x = xs.mark_sharding(torch.arange(64.0).reshape(8, 8).to("pjrt"), mesh, (0, 1))
y = (x @ x.T).relu().sum(1)
result = {"out": y.cpu().tolist(), "sharding": y.sharding_spec}
"""


@pytest.fixture
def cache_dir(monkeypatch):
    """Point the cache at a directory for one test (the module's own state is restored after)."""
    monkeypatch.setattr(_disk_cache, "_cache_dir", None)
    monkeypatch.setattr(_disk_cache, "_cache_dir_set", False)

    def use(path):
        xs.set_cache_dir(path)
        xs.clear_compile_cache()
        xs.reset_metrics()
        return path

    yield use
    xs.clear_compile_cache()


def compiled_and_loaded() -> tuple[int, int]:
    metrics = xs.metrics()
    return metrics.compiles, metrics.persistent_cache_hits


def entries(directory) -> list:
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def add_one(x):
    return x + 1


def times_two(x):
    return x * 2


X = torch.arange(8.0)


CHILD = STEP + textwrap.dedent("""
    m = xs.metrics()
    result.update(compiles=m.compiles, persistent=m.persistent_cache_hits)
    print(json.dumps(result))
""")


def test_compiled_programs_persist_across_processes(engine, cache_dir, tmp_path):
    """Two processes started together on an empty cache directory both write the entry; this
    process then loads it instead of compiling, and computes the same thing."""
    cache = tmp_path / "cache"
    env = dict(os.environ, PJRT_PLUGINS_CACHE_DIR=str(cache), TF_CPP_MIN_LOG_LEVEL="3")
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for there in results:  # each compiled and stored it, or loaded what the other stored
        assert (there["compiles"], there["persistent"]) in {(1, 0), (0, 1)}
    assert len(entries(cache)) == 1 and [p.name for p in cache.iterdir()] == [entries(cache)[0].name]
    cache_dir(cache)
    scope: dict = {}
    exec(STEP, scope)
    here = scope["result"]
    assert compiled_and_loaded() == (0, 1)
    x = torch.arange(64.0).reshape(8, 8)
    assert here["out"] == results[0]["out"] == results[1]["out"] == (x @ x.T).relu().sum(1).tolist()
    assert here["sharding"] == results[0]["sharding"]


def test_the_directory_and_its_entries_are_private(engine, cache_dir, tmp_path):
    cache = cache_dir(tmp_path / "new" / "cache")
    run(add_one, [X])
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    [entry] = entries(cache)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    xs.clear_compile_cache()
    assert run(add_one, [X])[0][0].tolist() == (X + 1).tolist()
    assert compiled_and_loaded() == (1, 1)


def test_an_entry_copied_over_another_programs_key_is_never_run(engine, cache_dir, tmp_path, caplog):
    """The entry of x + 1 copied over the file of x * 2: the next run of x * 2 sees the stored key
    differ, compiles x * 2 instead of computing x + 1, and replaces the entry."""
    cache_dir(tmp_path / "plus")
    run(add_one, [X])
    [plus] = entries(tmp_path / "plus")
    times = cache_dir(tmp_path / "times")
    run(times_two, [X])
    [entry] = entries(times)
    shutil.copyfile(plus, entry)
    xs.clear_compile_cache()
    xs.reset_metrics()
    with caplog.at_level(logging.WARNING, logger=_disk_cache.__name__):
        outputs, program = run(times_two, [X])
    assert outputs[0].tolist() == (X * 2).tolist()
    assert compiled_and_loaded() == (1, 0) and not program.from_disk
    assert "it was stored for another program_sha256; compiling instead" in caplog.text
    xs.clear_compile_cache()
    assert run(times_two, [X])[0][0].tolist() == (X * 2).tolist()  # the entry is x * 2's again
    assert compiled_and_loaded() == (1, 1)


@pytest.mark.parametrize("damage", ["flip a byte of the executable", "truncate", "not an entry"])
def test_a_damaged_entry_is_compiled_again(engine, cache_dir, tmp_path, caplog, damage):
    cache = cache_dir(tmp_path / "cache")
    run(add_one, [X])
    [entry] = entries(cache)
    data = bytearray(entry.read_bytes())
    if damage == "flip a byte of the executable":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(b"#!/bin/sh\n")
    entry.write_bytes(bytes(data))
    xs.clear_compile_cache()
    with caplog.at_level(logging.WARNING, logger=_disk_cache.__name__):
        assert run(add_one, [X])[0][0].tolist() == (X + 1).tolist()
    assert compiled_and_loaded() == (2, 0)
    assert "ignoring compile cache entry" in caplog.text and "compiling instead" in caplog.text


def test_a_directory_others_can_write_is_refused_with_a_warning(engine, cache_dir, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cache_dir(shared)
    with pytest.warns(CompileCacheWarning, match=r"writable by other users \(mode 0777\).*chmod 700"):
        assert run(add_one, [X])[0][0].tolist() == (X + 1).tolist()
    assert entries(shared) == []  # nothing written there


def test_a_directory_of_another_user_is_refused_with_a_warning(engine, cache_dir, tmp_path):
    if os.getuid() == 0:  # root: hand a fresh directory to "nobody"
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
    else:  # anyone else: a directory root owns
        theirs = Path("/")
    cache_dir(theirs)
    with pytest.warns(CompileCacheWarning, match=r"belongs to another user \(uid \d+\)"):
        assert run(add_one, [X])[0][0].tolist() == (X + 1).tolist()
    assert compiled_and_loaded() == (1, 0)
    if os.getuid() == 0:
        assert list(theirs.iterdir()) == []


def test_an_entry_is_not_read_once_others_can_write_its_directory(engine, cache_dir, tmp_path):
    cache = cache_dir(tmp_path / "cache")
    run(add_one, [X])
    cache.chmod(0o770)
    xs.clear_compile_cache()
    with pytest.warns(CompileCacheWarning, match="is writable by other users"):
        run(add_one, [X])
    assert compiled_and_loaded() == (2, 0)


KEY = {
    "format": _disk_cache.ENTRY_FORMAT,
    "program_sha256": "a" * 64,
    "compile_options_sha256": "b" * 64,
    "plugin": ["cpu", "pjrt-plugin-cpu", "1.0", "cpu", "0.81", "/lib/x.so", [0, 1]],
    "library": {"path": "/lib/x.so", "size": 100, "mtime_ns": 5, "api_version": [0, 81]},
    "platform": ["cpu", "0.81"],
}


def test_every_part_of_the_key_is_checked_before_an_entry_is_used(tmp_path):
    """Library file, plugin, options and program: an entry stored under one key and found under another
    (copied, or the plugin reinstalled) is never handed out."""
    directory = tmp_path / "cache"
    _disk_cache.store(directory, KEY, b"executable bytes", {"output_shardings": []})
    assert _disk_cache.load(directory, KEY) == (b"executable bytes", {"output_shardings": []})
    variants = {
        "library": {**KEY["library"], "mtime_ns": 6},
        "plugin": [*KEY["plugin"][:2], "1.1", *KEY["plugin"][3:]],
        "compile_options_sha256": "c" * 64,
        "program_sha256": "d" * 64,
    }
    [stored] = entries(directory)
    for field, value in variants.items():
        other = {**KEY, field: value}
        shutil.copyfile(stored, directory / _disk_cache._entry_name(other))
        assert _disk_cache.load(directory, other) is None, field


def test_an_entry_that_is_a_link_or_that_others_can_write_is_not_read(tmp_path, caplog):
    directory = tmp_path / "cache"
    _disk_cache.store(directory, KEY, b"executable bytes", {"output_shardings": []})
    [entry] = entries(directory)
    entry.chmod(0o622)
    with caplog.at_level(logging.WARNING, logger=_disk_cache.__name__):
        assert _disk_cache.load(directory, KEY) is None
    assert "not a private file of this user" in caplog.text
    real = tmp_path / "elsewhere"
    entry.chmod(0o600)
    entry.rename(real)
    entry.symlink_to(real)
    assert _disk_cache.load(directory, KEY) is None


@pytest.mark.parametrize(
    "header", [b"[1, 2]", b'{"key": [1, 2]}', b"[" * 100_000 + b"]" * 100_000, b"{not json", b'{"key": null}'],
    ids=["a list", "a key that is a list", "deeply nested", "not JSON", "no key"],
)
def test_an_entry_with_a_malformed_header_is_ignored(tmp_path, header):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    path = directory / _disk_cache._entry_name(KEY)
    path.write_bytes(_disk_cache._MAGIC + len(header).to_bytes(8, "little") + header + b"executable bytes")
    path.chmod(0o600)
    assert _disk_cache.load(directory, KEY) is None


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path):
    """Writers replacing one entry over and over on real threads (file writes release the GIL): a
    reader always finds a complete entry, and no temporary file is left behind."""
    directory = tmp_path / "cache"
    blobs = [bytes([i]) * (1 << 20) for i in range(4)]
    _disk_cache.store(directory, KEY, blobs[0], {"output_shardings": []})
    done = threading.Event()
    found: list = []

    def write(blob: bytes) -> None:
        for _ in range(10):
            _disk_cache.store(directory, KEY, blob, {"output_shardings": []})

    def read() -> None:
        while not done.is_set():
            entry = _disk_cache.load(directory, KEY)
            found.append(None if entry is None else entry[0] in blobs)

    writers = [threading.Thread(target=write, args=(blob,)) for blob in blobs]
    reader = threading.Thread(target=read)
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=120)
    done.set()
    reader.join(timeout=120)
    assert found and all(f is True for f in found), f"{found.count(None)} of {len(found)} reads found no valid entry"
    assert [p.name for p in directory.iterdir()] == [_disk_cache._entry_name(KEY)]


def test_the_key_names_the_library_file_by_size_and_modification_time(engine, tmp_path):
    client = engine.client
    key = _disk_cache.cache_key(b"program", b"options", client, ("cpu",))
    st = os.stat(client.library.path)
    assert key["library"]["size"] == st.st_size and key["library"]["mtime_ns"] == st.st_mtime_ns
    assert key["library"]["api_version"] == list(client.library.api_version)
    assert key != _disk_cache.cache_key(b"program2", b"options", client, ("cpu",))


# -- odd files at an entry's name ------------------------------------------------------------


@pytest.fixture
def bounded(monkeypatch):
    """The cache's size bound, restored after the test."""
    monkeypatch.setattr(_disk_cache, "_max_size", None)
    monkeypatch.delenv(_disk_cache.MAX_SIZE_ENV, raising=False)
    return _disk_cache.set_cache_max_size


def private_dir(path):
    path.mkdir(mode=0o700)
    return path


def load_within(directory, key, seconds: float = 20):
    """``load`` on a thread, so that a load that blocks fails the test instead of hanging it."""
    found: list = []
    worker = threading.Thread(target=lambda: found.append(_disk_cache.load(directory, key)), daemon=True)
    worker.start()
    worker.join(seconds)
    return worker.is_alive(), found


def test_a_fifo_at_an_entrys_name_is_skipped_not_waited_on(tmp_path, caplog):
    directory = private_dir(tmp_path / "cache")
    fifo = directory / _disk_cache._entry_name(KEY)
    os.mkfifo(fifo, 0o600)
    try:
        with caplog.at_level(logging.WARNING, logger=_disk_cache.__name__):
            blocked, found = load_within(directory, KEY)
        assert not blocked, "load() blocked on the FIFO"
        assert found == [None] and "it is a FIFO" in caplog.text and "compiling instead" in caplog.text
        _disk_cache.store(directory, KEY, b"executable bytes", {"output_shardings": []})  # replaces it
        assert _disk_cache.load(directory, KEY) == (b"executable bytes", {"output_shardings": []})
    finally:
        try:  # release a reader still blocked on it (the unfixed cache)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_a_directory_at_an_entrys_name_is_skipped_and_not_written_over(tmp_path, caplog):
    directory = private_dir(tmp_path / "cache")
    (directory / _disk_cache._entry_name(KEY)).mkdir()
    with caplog.at_level(logging.WARNING, logger=_disk_cache.__name__):
        assert _disk_cache.load(directory, KEY) is None
        _disk_cache.store(directory, KEY, b"executable bytes", {"output_shardings": []})
    assert "it is a directory" in caplog.text and "could not write a compile cache entry" in caplog.text
    assert [p.name for p in directory.iterdir()] == [_disk_cache._entry_name(KEY)]  # no temporary file left


def test_a_huge_sparse_entry_is_skipped_without_reading_it(tmp_path, caplog, bounded):
    directory = private_dir(tmp_path / "cache")
    entry = directory / _disk_cache._entry_name(KEY)
    with open(entry, "wb") as f:
        f.truncate(20 << 30)  # 20 GiB that take no disk; the default bound is 10 GiB
    entry.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger=_disk_cache.__name__):
        assert _disk_cache.load(directory, KEY) is None
    assert "it is 20.0 GiB, more than the cache may hold (10.0 GiB)" in caplog.text


# -- the size bound --------------------------------------------------------------------------


def key_of(n: int) -> dict:
    return {**KEY, "program_sha256": f"{n:064x}"}


def test_the_least_recently_used_entries_go_first_when_the_bound_is_passed(tmp_path, bounded):
    directory = tmp_path / "cache"
    blob = b"x" * 10_000
    for n in range(3):
        _disk_cache.store(directory, key_of(n), blob, {"output_shardings": []})
    size = (directory / _disk_cache._entry_name(key_of(0))).stat().st_size
    for n in range(3):  # stored at distinct, known times: 0 oldest
        os.utime(directory / _disk_cache._entry_name(key_of(n)), (1000 + n, 1000 + n))
    assert _disk_cache.load(directory, key_of(0)) is not None  # a load is a use: 0 is now the newest
    bounded(3 * size + size // 2)
    _disk_cache.store(directory, key_of(3), blob, {"output_shardings": []})
    kept = {n for n in range(4) if _disk_cache.load(directory, key_of(n)) is not None}
    assert kept == {0, 2, 3}  # 1 was the least recently used
    assert sum(p.stat().st_size for p in directory.iterdir()) <= 3 * size + size // 2


def test_an_executable_larger_than_the_bound_is_not_stored(tmp_path, bounded, caplog):
    directory = tmp_path / "cache"
    bounded("1k")
    with caplog.at_level(logging.WARNING, logger=_disk_cache.__name__):
        _disk_cache.store(directory, KEY, b"x" * 2000, {"output_shardings": []})
    assert entries(directory) == [] and "larger than the compile cache's bound of 1000 B" in caplog.text


def test_the_bound_comes_from_the_function_the_environment_or_the_default(monkeypatch, bounded):
    from pjrt_plugins._cache_files import DEFAULT_MAX_SIZE

    assert _disk_cache.cache_max_size() == DEFAULT_MAX_SIZE == 10 << 30
    monkeypatch.setenv(_disk_cache.MAX_SIZE_ENV, "1.5GiB")
    assert _disk_cache.cache_max_size() == 3 << 29
    bounded(12345)
    assert _disk_cache.cache_max_size() == 12345
    bounded(None)
    monkeypatch.setenv(_disk_cache.MAX_SIZE_ENV, "lots")
    with pytest.warns(CompileCacheWarning, match=r"PJRT_PLUGINS_CACHE_MAX_SIZE='lots'.*default bound of 10.0 GiB"):
        assert _disk_cache.cache_max_size() == DEFAULT_MAX_SIZE
    for bad in ("0", "-1G", "ten", "1e400G", True, 1.5):
        with pytest.raises(ValueError):
            bounded(bad)


def test_writers_under_a_bound_keep_the_directory_under_it(tmp_path, bounded):
    """Threads storing distinct programs (file writes release the GIL), each evicting: the directory
    ends under the bound, with no temporary file left and every surviving entry valid."""
    directory = tmp_path / "cache"
    blob = b"y" * (1 << 16)
    _disk_cache.store(directory, key_of(0), blob, {"output_shardings": []})
    size = entries(directory)[0].stat().st_size
    bounded(4 * size)

    def write(first: int) -> None:
        for n in range(first, first + 40, 4):
            _disk_cache.store(directory, key_of(n), blob, {"output_shardings": []})

    writers = [threading.Thread(target=write, args=(first,)) for first in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=120)
    left = list(directory.iterdir())
    assert all(p.name.endswith(_disk_cache._SUFFIX) for p in left), left
    assert 1 <= len(left) <= 4 and sum(p.stat().st_size for p in left) <= 4 * size
    for n in range(40):
        if (directory / _disk_cache._entry_name(key_of(n))).exists():
            assert _disk_cache.load(directory, key_of(n)) == (blob, {"output_shardings": []})


# -- pjrt-plugins cache ------------------------------------------------------------------------


def cache_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_PLUGINS_CACHE")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "pjrt_plugins", "cache", *args], capture_output=True, text=True,
                          env=environment, timeout=120)


def test_the_cache_command_shows_sizes_lists_and_clears_only_entries(tmp_path):
    directory = tmp_path / "cache"
    for n in range(3):
        _disk_cache.store(directory, key_of(n), b"z" * 1000, {"output_shardings": []})
    (directory / "notes.txt").write_text("mine")  # not an entry: never counted, never removed
    os.mkfifo(directory / ("f" * 64 + _disk_cache._SUFFIX))  # not a regular file: skipped, never opened
    env = {"PJRT_PLUGINS_CACHE_DIR": str(directory), "PJRT_PLUGINS_CACHE_MAX_SIZE": "1MiB"}
    total = sum(p.stat().st_size for p in directory.glob("*" + _disk_cache._SUFFIX) if p.is_file())
    size = cache_cli("size", "--json", env=env)
    assert size.returncode == 0, size.stderr
    assert json.loads(size.stdout) == {"directory": str(directory), "exists": True, "entries": 3, "bytes": total,
                                       "max_bytes": 1 << 20}
    listed = cache_cli("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["list"]
    assert sorted(r["program_sha256"] for r in rows) == [key_of(n)["program_sha256"] for n in range(3)]
    assert all(r["plugin"] == "cpu" and r["platform"] == "cpu 0.81" for r in rows)
    text = cache_cli("list", env=env)
    assert text.returncode == 0 and "3 entries" in text.stdout and "of at most 1.0 MiB" in text.stdout, text.stdout
    cleared = cache_cli("clear", "--dir", str(directory))
    assert cleared.returncode == 0 and cleared.stdout.startswith("removed 3 entries"), cleared
    assert sorted(p.name for p in directory.iterdir()) == sorted(["notes.txt", "f" * 64 + _disk_cache._SUFFIX])


def test_the_cache_command_without_a_directory_is_a_usage_error():
    result = cache_cli("size")
    assert result.returncode == 2 and "set PJRT_PLUGINS_CACHE_DIR or pass --dir" in result.stderr, result
