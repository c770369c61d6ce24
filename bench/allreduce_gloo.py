#!/usr/bin/python3
"""torch.distributed's Gloo all-reduce on this machine, for bench/allreduce.sh.

usage: allreduce_gloo.py WORKERS FLOATS ITERS
Starts WORKERS processes on 127.0.0.1, all-reduces (sum) a float32 tensor of FLOATS values
ITERS times after 3 warm-up rounds, and prints "gloo len=N workers=P p50_us=.. gbps=.. cpu_us=.."
(rank 0's latencies; algorithm bandwidth = bytes / p50; cpu_us: the median of rank 0's process CPU
time, all threads, within each all-reduce)."""
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, n, iters, port, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    g = torch.Generator().manual_seed(rank)
    lat, cpu = [], []
    for i in range(iters + 3):
        t = torch.rand(n, generator=g)
        c0, t0 = time.process_time(), time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t1, c1 = time.perf_counter(), time.process_time()
        if i >= 3:
            lat.append(t1 - t0)
            cpu.append(c1 - c0)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        lat.sort()
        cpu.sort()
        q.put((lat[len(lat) // 2], cpu[len(cpu) // 2]))


def main():
    world, n, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, world, n, iters, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    p50, cpu = q.get(timeout=600)
    for p in procs:
        p.join()
    print(f"gloo len={n} workers={world} p50_us={int(p50 * 1e6)} gbps={n * 4 / p50 / 1e9:.3f} "
          f"cpu_us={int(cpu * 1e6)}")


if __name__ == "__main__":
    main()
