#!/usr/bin/python3
"""The Python twin of bench_ps's push-pull measurements (a worker program, run under
`chainps launch`; bench/run_python.sh runs both interleaved and prints the comparison).

For each size: `reps` runs of `ops` blocking push_pull calls (latency p50 in microseconds) and of
`ops` pipelined push_pull_async calls with `depth` in flight, oldest first (MB/s counting both
directions, as bench_ps), and the worker's CPU time per call over both (bench_ps's
worker_cpu_us_per_op), on dense random float32 gradients (scale 1e-3), numpy buffers or
torch tensors. Prints one key=value line per size, the median of the runs.

usage: bench_python.py [--sizes 4096,1048576] [--reps 5] [--ms 1000] [--depth 4] [--torch]
"""
import argparse
import statistics
import sys
import time

import numpy as np

import chainps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,1048576")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ms", type=float, default=1000.0, help="length of one run")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--torch", action="store_true", help="torch tensors instead of numpy arrays")
    a = ap.parse_args()
    c = chainps.init()
    rng = np.random.default_rng(1)
    for size in (int(s) for s in a.sizes.split(",")):
        n = size // 4
        t = c.declare(f"bench/py/{size}", n, optim=chainps.SGD(1e-6))
        grad = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        outs = [np.zeros(n, np.float32) for _ in range(a.depth)]
        if a.torch:
            import torch

            grad = torch.from_numpy(grad)
            outs = [torch.from_numpy(o) for o in outs]
        # Calibrate the operation count from a warm-up, as bench_ps does.
        t0 = time.perf_counter()
        for _ in range(4):
            c.push_pull(t, grad, outs[0])
        per = (time.perf_counter() - t0) / 4
        ops = max(20, min(200000, int(a.ms / 1000 / max(per, 1e-9))))
        p50s, mbps = [], []
        cpu0, total = time.process_time(), 0
        for _ in range(a.reps):
            lat = []
            for _ in range(ops):
                s = time.perf_counter()
                c.push_pull(t, grad, outs[0])
                lat.append((time.perf_counter() - s) * 1e6)
            p50s.append(statistics.median(lat))
            hs = [None] * a.depth
            s = time.perf_counter()
            for i in range(ops):
                k = i % a.depth
                if hs[k] is not None:
                    hs[k].wait()
                hs[k] = c.push_pull_async(t, grad, outs[k])
            for h in hs:
                if h is not None:
                    h.wait()
            mbps.append(ops * size * 2 / (time.perf_counter() - s) / 1e6)
            total += 2 * ops
        cpu = (time.process_time() - cpu0) / total * 1e6
        print(f"py size={size} pp_p50={statistics.median(p50s):.2f} "
              f"pp_mbps={statistics.median(mbps):.1f} cpu_us={cpu:.2f} ops={ops} "
              f"buffers={'torch' if a.torch else 'numpy'}", flush=True)
    # The binding's own cost per call, without the network: a push_pull whose output is one
    # value short is refused after both buffers were taken and checked (an upper bound: it
    # also builds the ValueError). Steady where round trips on this VM drift by tens of us.
    t = c.declare("bench/py/binding", 1024, optim=chainps.SGD(1e-6))
    for kind in ("numpy", "torch"):
        if kind == "torch" and not a.torch:
            continue
        g = np.zeros(1024, np.float32)
        o = np.zeros(1023, np.float32)
        if kind == "torch":
            import torch

            g, o = torch.from_numpy(g), torch.from_numpy(o)
        n = 100000
        t0 = time.perf_counter()
        for _ in range(n):
            try:
                c.push_pull(t, g, o)
            except ValueError:
                pass
        print(f"py binding={kind} us={(time.perf_counter() - t0) / n * 1e6:.2f}", flush=True)
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
