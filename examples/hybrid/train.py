#!/usr/bin/python3
"""Hybrid training: a large embedding table on the servers, the dense layers all-reduced.

A bag-of-embeddings click-through model (EmbeddingBag over --vocab token ids, then two linear
layers) on data this script makes: every sample is --bag token ids drawn from a Zipf-like law
over the vocabulary, and its label says whether the sum of fixed hidden per-token scores (from
--data-seed) is positive, so the table has something to learn. Every worker makes the same data
set and trains on its share (rank r takes every W-th sample); the test set is made the same way
from another seed. Nothing is downloaded.

    chainps launch --servers 2 --workers 2 -- /usr/bin/python3 examples/hybrid/train.py
    chainps launch --servers 2 --workers 2 -- /usr/bin/python3 examples/hybrid/train.py --placement servers

--placement hybrid (default): the table on the servers (chainps.SGD), the dense layers
all-reduced among the workers and updated by a local torch.optim.SGD on each.
--placement servers: every parameter on the servers, for the comparison.
Prints the placement, loss lines and one ``final:`` line: test accuracy, samples/s, steps and a
checksum of all parameters (the same on every worker in sync mode).
"""

import argparse
import copy
import hashlib
import sys
import time

import numpy as np
import torch

import chainps
import chainps.torch


def make_data(n, vocab, bag, seed, data_seed):
    rng = np.random.default_rng(seed)
    hidden = np.random.default_rng(data_seed).standard_normal(vocab).astype(np.float32)
    # Zipf-like ids: a few frequent tokens and a long tail, as in click logs.
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = 1.0 / ranks ** 1.05
    p /= p.sum()
    ids = rng.choice(vocab, size=(n, bag), p=p).astype(np.int64)
    y = (hidden[ids].sum(axis=1) > 0).astype(np.float32)
    return torch.from_numpy(ids), torch.from_numpy(y)


class Model(torch.nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(vocab, dim, mode="mean", sparse=True)
        self.fc1 = torch.nn.Linear(dim, 32)
        self.fc2 = torch.nn.Linear(32, 1)

    def forward(self, ids):
        return self.fc2(torch.relu(self.fc1(self.embed(ids)))).squeeze(1)


def checksum(model):
    h = hashlib.blake2b(digest_size=8)
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def evaluate(model, opt, tx, ty):
    # The servers' values pulled into a copy of the model: this worker's own table rows are
    # only as fresh as its last pull of them, and the training must not see this pull.
    m = copy.deepcopy(model)
    params = dict(m.named_parameters())
    with torch.no_grad():
        hs = [opt.client.pull_async(t, params[n].data) for n, t in opt.tensors().items()]
        for h in hs:
            h.wait()
        return float(((m(tx) > 0).float() == ty).float().mean()) * 100


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--placement", choices=["hybrid", "servers"], default="hybrid")
    ap.add_argument("--vocab", type=int, default=100000, help="embedding rows (100000)")
    ap.add_argument("--dim", type=int, default=16, help="embedding width (16)")
    ap.add_argument("--bag", type=int, default=8, help="token ids per sample (8)")
    ap.add_argument("--samples", type=int, default=40000, help="training samples in all")
    ap.add_argument("--steps", type=int, default=600, help="steps per worker (600)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-seed", type=int, default=7)
    ap.add_argument("--log-every", type=int, default=200)
    ap.add_argument("--sync-every", type=int, default=1,
                    help="accumulate K steps' gradients: all-reduce the dense layers' and push "
                         "the table's rows (one rows_push of the window's rows) once every K (1)")
    ap.add_argument("--eval-at", default="",
                    help="steps (comma-separated) after which rank 0 prints the test accuracy "
                         "of the servers' current table with its dense layers (a copy: "
                         "training goes on unchanged), to see where the curve flattens")
    ap.add_argument("--warmup", type=int, default=0,
                    help="hybrid: N steps on each worker's own gradients, then average (0)")
    a = ap.parse_args(argv)
    eval_at = {int(s) for s in a.eval_at.split(",") if s}

    torch.set_num_threads(1)
    client = chainps.init()
    rank, workers = client.rank, client.num_workers
    torch.manual_seed(a.seed)
    model = Model(a.vocab, a.dim)
    local = None
    if a.placement == "hybrid":
        local = lambda ps: torch.optim.SGD(ps, lr=a.lr)  # noqa: E731
    # The table's gradients go as row pushes in both placements (only the rows a batch touched
    # cross the network), so the comparison is about where the dense layers live.
    opt = chainps.torch.DistributedOptimizer(model.named_parameters(), chainps.SGD(a.lr),
                                             client=client, local_optim=local, seed=a.seed,
                                             sparse=["embed.weight"], sync_every=a.sync_every,
                                             warmup_steps=a.warmup)
    if rank == 0:
        print(f"placement: {opt.placement()}", flush=True)

    x, y = make_data(a.samples, a.vocab, a.bag, 1000 + a.seed, a.data_seed)
    x, y = x[rank::workers], y[rank::workers]
    tx, ty = make_data(4000, a.vocab, a.bag, 2000 + a.seed, a.data_seed)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    t0 = time.perf_counter()
    seen = eval_pulled = 0
    n = x.shape[0]
    # A replacement of a dead worker starts at the step the others are on.
    for step in range(opt.start_step, a.steps):
        lo = (step * a.batch) % max(1, n - a.batch)
        xb, yb = x[lo:lo + a.batch], y[lo:lo + a.batch]
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        seen += xb.shape[0]
        if (step + 1) % a.log_every == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)
        if rank == 0 and step + 1 in eval_at:
            before = client.stats()["pull_bytes"]
            print(f"eval: step {step + 1} test accuracy {evaluate(model, opt, tx, ty):.2f}%",
                  flush=True)
            eval_pulled += client.stats()["pull_bytes"] - before  # not the training's traffic
    rate = seen * workers / (time.perf_counter() - t0)
    st = client.stats()  # the training loop's traffic, before the final pull
    client.barrier()  # every worker's last step is in before anyone reads the final values
    opt.pull()
    with torch.no_grad():
        acc = float(((model(tx) > 0).float() == ty).float().mean()) * 100
    print(f"final: test accuracy {acc:.2f}%, {rate:.1f} samples/s, steps {a.steps}, "
          f"checksum {checksum(model)}, pushed {st['push_wire_bytes']} bytes, pulled "
          f"{st['pull_bytes'] - eval_pulled} bytes, all-reduce sent "
          f"{st['allreduce_bytes_sent']} bytes", flush=True)
    client.barrier()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1:])
