#!/usr/bin/python3
"""A worker of test_hybrid.py's sync_every tests for the servers' parameters (issue 29): a table
of rows (row pushes), a dense layer on the servers and a head all-reduced, trained for --steps
steps with DistributedOptimizer(sync_every=--k, warmup_steps=--warmup). Prints one line:

    server_freq_job: rank R checksum C pushes N push_raw P pull Q allreduce A moved S1,S2,...

(the client's counters of the training loop, and the job's steps after which the servers' dense
layer changed in this worker's model).

Rank r's bags hold only ids = r (mod workers): row pushes apply on arrival even in sync mode,
so rows that two workers share would make the bits depend on which push a server got first.
With disjoint rows every value has one writer and the run is repeatable bit for bit.

For test_freq_replace.py: --step-ms paces the steps, --out makes each step append its number to
OUT/rankR.txt once done (so the test can kill a worker inside a window), and each worker prints
"server_freq_job: rank R starts at S clock C" (the optimizer's start_step, and the servers' push
clock, cps_start_step, that it was derived from)."""
import argparse
import hashlib
import os
import sys
import time

import torch

import chainps
import chainps.torch

VOCAB, DIM, BAG, BATCH = 64, 8, 8, 32


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(VOCAB, DIM, mode="mean", sparse=True)
        self.dense = torch.nn.Linear(DIM, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, ids):
        return self.head(torch.tanh(self.dense(self.embed(ids)))).squeeze(1)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--step-ms", type=float, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--step-data", action="store_true",
                    help="draw each step's batch from a generator seeded by (rank, step), so a "
                         "job restored at step S trains on the batches the whole run had there")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    client = chainps.init()
    rank, nw = client.rank, client.num_workers
    torch.manual_seed(3)
    model = Net()
    opt = chainps.torch.DistributedOptimizer(
        model.named_parameters(), chainps.SGD(0.2), client=client, seed=5,
        on_servers={"embed.weight", "dense.weight", "dense.bias"}, sparse=["embed.weight"],
        local_optim=lambda ps: torch.optim.SGD(ps, lr=0.2), sync_every=a.k,
        warmup_steps=a.warmup)
    assert opt.placement() == {"servers": ["embed.weight", "dense.weight", "dense.bias"],
                               "allreduce": ["head.weight", "head.bias"]}, opt.placement()
    print(f"server_freq_job: rank {rank} starts at {opt.start_step} clock {client.start_step}",
          flush=True)
    g = torch.Generator().manual_seed(100 + rank)
    mine = torch.arange(rank, VOCAB, nw)
    moved = []
    log = open(os.path.join(a.out, f"rank{rank}.txt"), "a") if a.out else None
    for step in range(opt.start_step, a.steps):
        if a.step_ms:
            time.sleep(a.step_ms / 1000)
        if a.step_data:
            g = torch.Generator().manual_seed(1000 * rank + step)
        ids = mine[torch.randint(len(mine), (BATCH, BAG), generator=g)]
        y = (ids.float().mean(1) > VOCAB / 2).float()
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(ids), y).backward()
        before = model.dense.weight.detach().clone()
        opt.step()
        if not torch.equal(before, model.dense.weight):
            moved.append(step)
        if log:
            log.write(f"{step}\n")
            log.flush()
    st = client.stats()  # the training loop's traffic, before the final pull
    client.barrier()
    opt.pull()
    h = hashlib.blake2b(digest_size=8)
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().numpy().tobytes())
    print(f"server_freq_job: rank {rank} checksum {h.hexdigest()} pushes {st['pushes']} "
          f"push_raw {st['push_raw_bytes']} pull {st['pull_bytes']} "
          f"allreduce {st['allreduce_bytes_sent']} moved {','.join(map(str, moved))}",
          flush=True)
    client.barrier()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1:])
