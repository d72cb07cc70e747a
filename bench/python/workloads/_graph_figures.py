"""What a program that captures CUDA graphs measured live, for comparison with a replay
of its trace (graph_decode.py, compile_gpt2_train.py)."""

import json


def pools_by_id(torch):
    """Each private pool's reserved bytes now, by the snapshot's segment_pool_id."""
    pools = {}
    for seg in torch.cuda.memory_snapshot():
        pool = tuple(seg.get("segment_pool_id", (0, 0)))
        if pool != (0, 0):
            pools[str(pool)] = pools.get(str(pool), 0) + seg["total_size"]
    return pools


def pools_reserved(torch):
    """What every private pool reserves now, together."""
    return sum(pools_by_id(torch).values())


def report(torch, figures, path, quiet=()):
    """Adds the peak and current reserved bytes and each private pool's reserved bytes
    now (the snapshot's segments by segment_pool_id) to figures; prints them (without
    the keys in quiet) and writes them to path (JSON) when given."""
    pools = pools_by_id(torch)
    figures.update({"max_memory_reserved": torch.cuda.max_memory_reserved(),
                    "memory_reserved": torch.cuda.memory_reserved(), "pools_reserved": pools})
    print(json.dumps({k: v for k, v in figures.items() if k not in quiet}))
    if path:
        with open(path, "w") as f:
            json.dump(figures, f)
