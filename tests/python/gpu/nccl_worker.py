"""A one-rank NCCL process group under reservoir.torch with PyTorch's allocator hook
(TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1), in a fresh process: ProcessGroupNCCL
registers the segments the allocator lists when the communicator is made, then every
segment made (through the allocator's trace trackers), and deregisters those given
back. Prints one JSON line: what NCCL registered (its NCCL_DEBUG=INFO "register comm
... buffer ... size ..." lines), the segments Reservoir held at the collective, the
segment entries delivered, the all-reduce's result, and what went wrong.

    python3 nccl_worker.py --config policy:compact --log-dir DIR
"""

import argparse
import glob
import json
import os
import re
import socket
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def registrations(log_dir):
    """(buffer address, size) of every "register comm ... buffer ... size ..." line."""
    found = []
    for path in glob.glob(os.path.join(log_dir, "nccl.*.log")):
        with open(path, errors="replace") as fh:
            for line in fh:
                m = re.search(r"register comm \S+ buffer (0x[0-9a-f]+) size (\d+)", line)
                if m:
                    found.append((int(m.group(1), 16), int(m.group(2))))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="", help="Reservoir's settings (\"\": defaults)")
    parser.add_argument("--log-dir", required=True, help="where NCCL writes its debug log")
    args = parser.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    os.environ.update({
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "1",
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "REG",
        "NCCL_DEBUG_FILE": os.path.join(args.log_dir, "nccl.%p.log"),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
    })
    import reservoir
    import reservoir.torch

    reservoir.torch.install(config=args.config or None)
    events = []

    def tracker(action, device, address, size, stream, pool):
        if action.startswith("segment"):
            events.append((action, address, size))

    reservoir.attach_trace_tracker(tracker)
    import torch
    import torch.distributed as dist

    report = {"config": args.config, "native": reservoir.torch.native_status(),
              "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    # Memory from before the communicator: registered from the allocator's listing.
    early = [torch.full((n,), 1.0, device=device) for n in (8 << 20, 300_000, 3 << 20)]
    listed_before = reservoir.segments(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    # Memory made afterwards: registered through the trace trackers.
    late = [torch.full((n,), 2.0, device=device) for n in (24 << 20, 5 << 20)]
    for t in early + late:
        dist.all_reduce(t)
    torch.cuda.synchronize()
    report["sums_right"] = all(
        bool((t == v).all()) for t, v in zip(early + late, [1.0] * len(early) + [2.0] * len(late)))
    held = reservoir.segments(0)
    report["segments_at_collective"] = [(s["address"], s["size"]) for s in held]
    report["segments_before_communicator"] = len(listed_before)
    del early, late, t
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    report["segments_after_empty_cache"] = len(reservoir.segments(0))
    report["segment_entries"] = events
    dist.destroy_process_group()
    report["registered"] = registrations(args.log_dir)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
