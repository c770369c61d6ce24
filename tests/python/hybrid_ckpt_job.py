#!/usr/bin/python3
"""A worker of test_hybrid_ckpt.py: examples/hybrid's model (table on the servers, dense layers
all-reduced) with a local SGD with momentum (or Adam), so the local optimizer has state to
checkpoint. With --compare it records the steps after which the two workers' all-reduced
parameters or local optimizer state differ (DUMP/apart-R.txt): a warm-up's, and no others.

Right after DistributedOptimizer is built (in a restored job: after it took the export's local
tensors back) it saves this worker's all-reduced parameters and local optimizer state to
DUMP/rank-R.pt, then trains to --steps with --step-ms between steps (so that the periodic
checkpoints of the first job find steps to cut at)."""
import argparse
import os
import sys
import time

import torch

import chainps
import chainps.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "hybrid"))
import train as hybrid  # noqa: E402


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=5)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--adam", action="store_true", help="local Adam instead of SGD+momentum")
    ap.add_argument("--table-only", "--tables", dest="table_only", action="store_true",
                    help="only the embedding on the servers, as row pushes: the servers hold no "
                    "dense tensor, so the job's steps are the workers'")
    ap.add_argument("--warmup", type=int, default=0, help="warmup_steps")
    ap.add_argument("--compare", action="store_true",
                    help="after every step, compare the all-reduced parameters and the local "
                    "optimizer's state with the other worker's (DUMP/apart-R.txt)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    client = chainps.init()
    torch.manual_seed(1)
    model = hybrid.Model(2000, 8)
    opt = chainps.torch.DistributedOptimizer(
        model.named_parameters(), chainps.SGD(0.5), client=client, seed=1,
        local_optim=(lambda ps: torch.optim.Adam(ps, lr=0.01)) if a.adam else
        (lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9)),
        # Every server tensor pushed dense (a sync aggregate per step), or with --table-only
        # the table as row pushes (the servers then have no step boundary).
        sparse=["embed.weight"] if a.table_only else (), warmup_steps=a.warmup)
    local = {n: p.detach().clone() for n, p in model.named_parameters() if n != "embed.weight"}
    torch.save({"start_step": opt.start_step, "params": local,
                "optim": opt.local_optimizer.state_dict()},
               os.path.join(a.dump, f"rank-{client.rank}.pt"))
    x, y = hybrid.make_data(4000, 2000, 4, 1001, 7)
    x, y = x[client.rank::client.num_workers], y[client.rank::client.num_workers]
    loss_fn = torch.nn.BCEWithLogitsLoss()
    apart = []  # the job's steps after which the workers' all-reduced parameters differ

    def differ():
        # The mean: equal bits give themselves back, also while the other worker is dead.
        local = [p for n, p in model.named_parameters() if n != "embed.weight"]
        st = opt.local_optimizer.state
        v = torch.cat([p.detach().reshape(-1) for p in local] +
                      [t.reshape(-1) for p in local for _, t in sorted(st[p].items())
                       if torch.is_tensor(t)])
        mean = v.clone()
        client.allreduce(mean, "mean")
        return not torch.equal(mean, v)

    for step in range(opt.start_step, a.steps):
        # The comparison of the last step's result comes first in the loop, before opt.step():
        # a replacement starts its loop after the step it fetched (opt.step() shares the state
        # at its end), so an all-reduce of our own after opt.step() would be one it never runs
        # (docs/collective.md).
        # Every worker compares at every step, a replacement's first included, so that the
        # all-reduces pair up; what is compared is the state after step - 1.
        if a.compare and differ() and step > 0:
            apart.append(step - 1)
        lo = (step * 32) % (x.shape[0] - 32)
        opt.zero_grad()
        loss_fn(model(x[lo:lo + 32]), y[lo:lo + 32]).backward()
        opt.step()
        if a.compare and step % 50 == 0:
            print(f"hybrid_ckpt_job: rank {client.rank} step {step}", flush=True)
        time.sleep(a.step_ms / 1000)
    if a.compare and a.steps > opt.start_step and differ():
        apart.append(a.steps - 1)
    with open(os.path.join(a.dump, f"apart-{client.rank}.txt"), "w") as f:
        f.write(" ".join(map(str, apart)))
    client.barrier()
    print(f"hybrid_ckpt_job: OK rank {client.rank} from {opt.start_step}", flush=True)
    client.barrier()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1:])
