"""Each process of a torchrun job creates its plugin's client and prints its view of the job's devices.

    PJRT_DEVICE=stub_neuron torchrun --nproc-per-node 2 examples/multihost_devices.py

Across two hosts, run on each (node rank 0 on the host named by --master-addr):

    torchrun --nnodes 2 --node-rank <0|1> --nproc-per-node 2 \\
        --master-addr <host of node rank 0> --master-port 29500 examples/multihost_devices.py
"""

from __future__ import annotations

import logging
import os

import numpy as np

from pjrt_plugins import distributed


def main() -> None:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"), format="[rank %(process)d] %(name)s: %(message)s")
    info = distributed.process_info()
    with distributed.create_client() as client:
        mine = [d.id for d in client.addressable_devices]
        buffer = client.buffer_from_host(np.arange(4, dtype=np.float32) + info.rank)
        print(
            f"rank {info.rank}/{info.world_size} host {info.host_index} "
            f"local {info.local_rank}/{info.local_world_size}: "
            f"{client.platform_name} process_index={client.process_index} devices={len(client.devices)} "
            f"addressable={mine} buffer on device {buffer.device.id}: {buffer.to_numpy().tolist()}",
            flush=True,
        )


if __name__ == "__main__":
    main()
