"""Sharded upload and gather of a 256 MiB float32 tensor over 8 CPU devices, against jax in the same run.

Ours: ``xs.mark_sharding`` (upload of each device's shard) and ``.cpu()`` (gather), on the
pjrt-plugin-cpu plugin with 8 devices. jax 0.10.2: ``jax.device_put`` with a ``NamedSharding``
over 8 host devices (``--xla_force_host_platform_device_count=8``) and ``np.asarray``, in a worker
process (two XLA runtimes do not share a process), rounds interleaved so machine load hits both.
Goal: each time within 1.2x of jax; bytes moved per device equal to the shard sizes.
Run: python benchmarks/spmd_transfer.py [--size-mib 256] [--repeats 7] [--devices 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _measure import JaxWorker, serve_commands

GOAL = 1.2
#: Partition specs measured: (label, ours, jax's PartitionSpec entries).
SPECS = {
    "rows": ((0, None), ("x", None)),
    "cols": ((None, 0), (None, "x")),
}


def make_host_array(size_mib: int, devices: int):
    """The same deterministic float32 matrix on both sides: (rows, cols) with rows and cols divisible by devices."""
    import numpy as np

    cols = 2048
    rows = size_mib * 1024 * 1024 // 4 // cols
    return np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32), rows, cols


# -- jax worker ------------------------------------------------------------------------------------


def jax_worker(size_mib: int, devices: int) -> int:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    host, _, _ = make_host_array(size_mib, devices)
    mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))

    def run(command: list[str]) -> dict:
        sharding = NamedSharding(mesh, PartitionSpec(*SPECS[command[1]][1]))
        t0 = time.perf_counter()
        array = jax.device_put(host, sharding)
        array.block_until_ready()
        t1 = time.perf_counter()
        back = np.asarray(array)
        t2 = time.perf_counter()
        shard_bytes = sorted({s.data.nbytes for s in array.addressable_shards})
        ok = bool(np.array_equal(back, host))
        del array, back
        return {"upload": t1 - t0, "gather": t2 - t1, "ok": ok, "shard_bytes": shard_bytes}

    return serve_commands({"ready": len(jax.devices()), "version": jax.__version__}, run)


# -- ours ---------------------------------------------------------------------------------------------


def ours_round(xs, torch_host, mesh, spec) -> dict:
    t0 = time.perf_counter()
    tensor = torch_host.to("pjrt")  # deferred: a host snapshot, nothing moves
    t1 = time.perf_counter()
    xs.reset_transfer_counters()
    xs.mark_sharding(tensor, mesh, spec)
    for buffer in tensor._pjrt_data.buffers:
        buffer.block_until_ready()
    t2 = time.perf_counter()
    uploaded = xs.transfer_counters()
    xs.reset_transfer_counters()
    back = tensor.cpu()
    t3 = time.perf_counter()
    downloaded = xs.transfer_counters()
    ok = bool(back.equal(torch_host))
    del tensor, back
    return {
        "snapshot": t1 - t0,
        "upload": t2 - t1,
        "gather": t3 - t2,
        "ok": ok,
        "uploaded": uploaded.uploaded,
        "downloaded": downloaded.downloaded,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds per spec (default 7)")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--specs", default="rows,cols", help="comma-separated: rows (dim 0 split), cols (dim 1)")
    parser.add_argument("--jax-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jax_worker:
        return jax_worker(args.size_mib, args.devices)

    import torch

    import pjrt_plugins.spmd as xs

    host, rows, cols = make_host_array(args.size_mib, args.devices)
    torch_host = torch.from_numpy(host)
    xs.set_plugin("cpu", options={"cpu_device_count": args.devices})
    vd = xs.virtual_device()
    mesh = xs.Mesh(range(args.devices), (args.devices,), ("x",))
    print(f"tensor: {rows}x{cols} float32 = {host.nbytes / 2**20:.0f} MiB; ours: plugin {vd.plugin.name!r} "
          f"with {vd.num_devices} devices", flush=True)
    worker = JaxWorker(__file__, ["--size-mib", str(args.size_mib), "--devices", str(args.devices)], args.devices)
    print(f"jax {worker.info['version']}: {worker.info['ready']} host devices (worker process)", flush=True)

    failures = 0
    try:
        for label in args.specs.split(","):
            spec = SPECS[label][0]
            expected = xs.Mesh(range(args.devices), (args.devices,)).get_op_sharding(spec)
            shard_bytes = 1
            for n in expected.shard_shape((rows, cols)):
                shard_bytes *= n
            shard_bytes *= 4
            ours, theirs = [], []
            ours_round(xs, torch_host, mesh, spec)  # warm-up (first-touch of memory, client start)
            worker.request("run", label)
            for _ in range(args.repeats):
                ours.append(ours_round(xs, torch_host, mesh, spec))
                theirs.append(worker.request("run", label))
            if not all(r["ok"] for r in ours + theirs):
                print(f"[{label}] ERROR: a gather did not return the original tensor")
                failures += 1
            print(f"\n== spec {label}: ours {spec} / jax PartitionSpec{SPECS[label][1]}; "
                  f"median of {args.repeats} (min in brackets), ms")
            print(f"{'phase':<34}{'ours':>16}{'jax':>16}{'ratio':>8}  goal <= {GOAL}x")

            def med(rounds, key):
                values = [r[key] for r in rounds]
                return statistics.median(values) * 1e3, min(values) * 1e3

            rows_out = [
                ("upload: mark_sharding / device_put", med(ours, "upload"), med(theirs, "upload")),
                ("gather: .cpu() / np.asarray", med(ours, "gather"), med(theirs, "gather")),
            ]
            round_trip_ours = [{"t": r["upload"] + r["gather"]} for r in ours]
            round_trip_jax = [{"t": r["upload"] + r["gather"]} for r in theirs]
            rows_out.append(("round trip (upload + gather)", med(round_trip_ours, "t"), med(round_trip_jax, "t")))
            with_snapshot = [{"t": r["snapshot"] + r["upload"] + r["gather"]} for r in ours]
            rows_out.append(("  incl. .to('pjrt') host snapshot", med(with_snapshot, "t"), med(round_trip_jax, "t")))
            for name, (o_med, o_min), (j_med, j_min) in rows_out:
                ratio = o_med / j_med
                flag = "" if ratio <= GOAL else "  (over goal)"
                print(f"{name:<34}{o_med:>8.1f} [{o_min:>5.1f}]{j_med:>8.1f} [{j_min:>5.1f}]{ratio:>7.2f}x{flag}")
            snap = statistics.median(r["snapshot"] for r in ours) * 1e3
            print(f"{'(.to(pjrt) snapshot alone)':<34}{snap:>8.1f}")
            last = ours[-1]
            print(f"bytes per device (ours): shard {shard_bytes:,}; uploaded "
                  f"{sorted(set(last['uploaded'].values()))} to {len(last['uploaded'])} devices, downloaded "
                  f"{sorted(set(last['downloaded'].values()))} from {len(last['downloaded'])}; "
                  f"jax shards {theirs[-1]['shard_bytes']}")
            exact = set(last["uploaded"].values()) == {shard_bytes} and set(last["downloaded"].values()) == {shard_bytes}
            print(f"bytes moved equal the shard sizes: {'yes' if exact else 'NO'}")
            failures += 0 if exact else 1
    finally:
        worker.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
