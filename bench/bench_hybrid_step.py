#!/usr/bin/python3
"""The per-step cost of chainps.torch.DistributedOptimizer's all-reduced half: a worker of
bench/run_hybrid_step.sh. An MLP of WIDTH units wide, every parameter all-reduced (hybrid mode
with nothing on the servers) and updated by a local SGD with momentum; each step runs forward
and backward untimed, then times zero_grad() + step() (the optimizer's own cost: the
gradients' all-reduce, the local optimizer, the share to replacements and the checkpoint
listing), and the whole step with forward and backward (the old code's zero_grad left the
gradients' allocation to backward). Prints one line: "hybrid_step: width W params P steps N
median_us M p90_us Q whole_median_us T"."""
import argparse
import sys
import time

import torch

import chainps
import chainps.torch


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warm", type=int, default=50, help="untimed steps first")
    ap.add_argument("--sync-every", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    client = chainps.init()
    torch.manual_seed(1)
    w = a.width
    model = torch.nn.Sequential(torch.nn.Linear(64, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                torch.nn.ReLU(), torch.nn.Linear(w, 10))
    opt = chainps.torch.DistributedOptimizer(
        model.named_parameters(), client=client, on_servers=lambda n, p: False,
        local_optim=lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
        sync_every=a.sync_every)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(client.rank))
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(client.rank))
    loss_fn = torch.nn.CrossEntropyLoss()
    times, whole = [], []
    for i in range(a.warm + a.steps):
        t0 = time.perf_counter()
        loss_fn(model(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        t2 = time.perf_counter()
        if i >= a.warm:
            times.append((t2 - t1) * 1e6)
            whole.append((t2 - t0) * 1e6)
    times.sort()
    whole.sort()
    n = sum(p.numel() for p in model.parameters())
    print(f"hybrid_step: width {w} params {n} steps {a.steps} median_us "
          f"{times[len(times) // 2]:.1f} p90_us {times[int(len(times) * 0.9)]:.1f} "
          f"whole_median_us {whole[len(whole) // 2]:.1f}", flush=True)
    client.close()


if __name__ == "__main__":
    main(sys.argv[1:])
