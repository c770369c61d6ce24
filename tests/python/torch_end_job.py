#!/usr/bin/python3
"""A worker of test_torch_end.py: a small model whose every parameter is all-reduced
(chainps.torch.DistributedOptimizer with a local optimizer), trained for --steps steps of at
least --step-ms each. Each step appends "STEP CHECKSUM" to OUT/rankR.txt once it is done, so the
test can kill a worker inside the job's last step. At the end it prints "torch_end_job: rank R
final checksum C after S steps".

A replacement that starts after the other workers finished (its predecessor died in the last
step) gets chainps.JobEnded from the optimizer's constructor. It is caught here only to print
that it came (with its status) and raised again, so the script ends as any user's script that
does not catch it: SystemExit, status 0."""
import argparse
import hashlib
import os
import time

import torch

import chainps
import chainps.torch


def checksum(model):
    h = hashlib.blake2b(digest_size=8)
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    client = chainps.init()
    rank = client.rank
    torch.manual_seed(100 + rank)  # different local values: rank 0's are taken
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    try:
        opt = chainps.torch.DistributedOptimizer(
            model.named_parameters(), client=client, on_servers=lambda n, p: False,
            local_optim=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    except chainps.JobEnded as e:
        print(f"torch_end_job: nothing left to train: {e} (chainps.JobEnded, status {e.code})",
              flush=True)
        raise
    print(f"torch_end_job: rank {rank} starts at step {opt.start_step}", flush=True)
    with open(os.path.join(args.out, f"rank{rank}.txt"), "a") as log:
        for step in range(opt.start_step, args.steps):
            time.sleep(args.step_ms / 1000)
            g = torch.Generator().manual_seed(1000 * rank + step)
            x = torch.randn(32, 16, generator=g)
            y = x[:, :1] * 0.5 - x[:, 1:2]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            log.write(f"{step} {checksum(model)}\n")
            log.flush()
    client.barrier()
    print(f"torch_end_job: rank {rank} final checksum {checksum(model)} after "
          f"{opt.step_count} steps", flush=True)
    client.close()


if __name__ == "__main__":
    main()
