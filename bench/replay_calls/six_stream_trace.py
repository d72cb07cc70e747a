#!/usr/bin/env python3
# Writes a synthetic six-stream serving trace (docs/trace_format.md) to the path given:
# usage: six_stream_trace.py OUT.trace.gz   (48,223 events; docs/benchmarks.md)
# Each stream runs requests of varying batch size, allocating activations (small and
# large) and freeing them; a stream hands a block to another (record_stream) now and
# then; occasional host waits. Deterministic (seed 6).
import gzip, random, sys
rnd = random.Random(6)
out = []
nid = 0
live = {s: [] for s in range(6)}
out.append("# trace v1: a,ID,SIZE,STREAM | f,ID | u,ID,STREAM | s,STREAM")
for step in range(3000):
    s = rnd.randrange(6)
    batch = rnd.choice([1, 2, 4, 8, 16, 32])
    for k in range(rnd.randint(4, 12)):
        kind = rnd.random()
        if kind < 0.5:
            size = rnd.choice([256, 512, 1024, 4096, 8192, 65536]) * batch
        else:
            size = rnd.randint(1, 64) * batch * 65536 + rnd.randrange(512)
        out.append(f"a,{nid},{size},{s}")
        live[s].append(nid); nid += 1
    if rnd.random() < 0.1:
        other = rnd.randrange(6)
        if live[s] and other != s:
            out.append(f"u,{live[s][-1]},{other}")
    while len(live[s]) > rnd.randint(4, 24):
        i = live[s].pop(rnd.randrange(len(live[s])))
        out.append(f"f,{i}")
    if rnd.random() < 0.02:
        out.append(f"s,{s}")
for s in range(6):
    for i in live[s]:
        out.append(f"f,{i}")
with gzip.open(sys.argv[1], "wt") as f:
    f.write("\n".join(out) + "\n")
print(len(out) - 1, "events")
