#!/usr/bin/python3
"""LeNet-5 on Fashion-MNIST, trained by PyTorch through chainps.

LeNet-5 (two 5x5 convolutions, three linear layers; ``--model tiny`` is the one-convolution model
of Ray's parameter-server example, for tests), trained on Debian's dataset-fashion-mnist, read
with numpy (no download). One script serves every role, as in MindSpore's parameter-server mode:

    chainps launch --servers 3 --workers 2 --mode sync -- /usr/bin/python3 examples/torch/train.py

or by hand, one process per role (see README.md beside this file):

    MS_ROLE=MS_SCHED   MS_SCHED_HOST=127.0.0.1 MS_SCHED_PORT=9091 MS_WORKER_NUM=2 MS_SERVER_NUM=2 python3 train.py
    MS_ROLE=MS_PSERVER ...
    MS_ROLE=MS_WORKER  ...

It prints MindSpore-style lines (``epoch: 1 step: 100, loss is 0.512``) and, at the end, one
``final:`` line with the test accuracy, samples/s and a checksum of the parameters; in sync mode
every worker prints the same checksum, and a run with a server killed on the way prints the
same one as a run without. ``--local`` trains in this process alone, as the baseline.
"""

import argparse
import gzip
import hashlib
import math
import os
import struct
import sys
import time

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["lenet", "tiny"], default="lenet",
                    help="lenet: LeNet-5 (the default); tiny: one convolution and one linear "
                         "layer, for tests that run many short jobs")
    ap.add_argument("--epochs", type=int, default=1, help="passes over this worker's shard (1)")
    ap.add_argument("--steps", type=int, default=0, help="stop after N steps in all (0: no limit)")
    ap.add_argument("--batch", type=int, default=64, help="batch size per worker (64)")
    ap.add_argument("--optimizer", choices=["sgd", "momentum", "adam"], default="momentum",
                    help="server-side optimizer (momentum 0.9)")
    ap.add_argument("--lr", type=float, default=0.0,
                    help="learning rate (default sgd 0.1, momentum 0.02, adam 0.002)")
    ap.add_argument("--seed", type=int, default=1, help="initial values and shuffles (1)")
    ap.add_argument("--log-every", type=int, default=100, help="loss line every N steps (100)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: workers share the machine's cores)")
    ap.add_argument("--no-overlap", action="store_true",
                    help="push every gradient after backward() instead of from its hook")
    ap.add_argument("--allreduce", action="store_true",
                    help="keep every parameter on the workers, all-reduced among them each step "
                         "and updated there by the same optimizer (torch.optim), not on the "
                         "servers")
    ap.add_argument("--sync-every", type=int, default=1, metavar="K",
                    help="accumulate K steps' gradients and talk to the ring (--allreduce: "
                         "all-reduce and step once every K) or the servers (push the K steps' "
                         "mean and pull once every K) (1)")
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="with --allreduce: N steps on each worker's own gradients, then the "
                         "parameters are averaged (0)")
    ap.add_argument("--local", action="store_true",
                    help="train in this process alone (torch.optim), without a parameter server")
    ap.add_argument("--eval", metavar="CKPT",
                    help="load a chainps checkpoint into the model, print its test accuracy, exit")
    ap.add_argument("--save", metavar="PATH", help="rank 0 saves the final state_dict (torch.save)")
    ap.add_argument("--slow-ms", type=float, default=0.0,
                    help="sleep this long per step (to make one worker a straggler)")
    ap.add_argument("--compress", metavar="SPEC",
                    help="lossy push compression of the weight matrices (fp16, bf16, topk:R); "
                         "biases stay float32 (default: the job's CHAINPS_COMPRESS)")
    ap.add_argument("--data", default=DATA, help=f"IDX .gz files ({DATA})")
    a = ap.parse_args(argv)
    if a.epochs < 1 or a.batch < 1 or a.steps < 0 or a.threads < 1 or a.lr < 0:
        ap.error("--epochs, --batch and --threads must be >= 1; --steps and --lr >= 0")
    if a.sync_every < 1 or a.warmup < 0:
        ap.error("--sync-every must be >= 1 and --warmup >= 0")
    # The servers' parameters have no warm-up (one copy, on the servers): without --allreduce
    # the flag would silently do nothing.
    if a.warmup and not a.allreduce:
        ap.error("--warmup needs --allreduce")
    if a.allreduce and a.local:
        ap.error("--allreduce and --local exclude each other")
    if not a.lr:
        a.lr = {"sgd": 0.1, "momentum": 0.02, "adam": 0.002}[a.optimizer]
    return a


def read_idx(path, magic, dims):
    """A gzipped IDX file as a numpy array; every malformed case raises naming the file."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        sys.exit(f"train.py: cannot read {path}: {e} (install dataset-fashion-mnist)")
    if len(raw) < 4 + 4 * dims:
        sys.exit(f"train.py: {path}: truncated")
    head = struct.unpack(">" + "I" * (1 + dims), raw[: 4 + 4 * dims])
    if head[0] != magic:
        sys.exit(f"train.py: {path}: bad magic {head[0]:#x}")
    shape = head[1:]
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        sys.exit(f"train.py: {path}: {body.size} bytes of data for shape {shape}")
    return body.reshape(shape)


def load(data_dir, split):
    x = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"), 0x803, 3)
    y = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"), 0x801, 1)
    if len(x) != len(y) or y.max() > 9:
        sys.exit(f"train.py: {split}: {len(x)} images, {len(y)} labels, max label {y.max()}")
    # The dataset's mean and standard deviation, as torchvision's examples normalise it.
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return x.reshape(-1, 1, 28, 28), y.astype(np.int64)


def make_model(torch, kind="lenet"):
    nn, F = torch.nn, torch.nn.functional

    class LeNet(nn.Module):
        """LeNet-5 (LeCun et al., 1998) with ReLU and max-pooling: two 5x5 convolutions and
        three linear layers, 61,706 parameters in 10 tensors."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = F.relu(self.fc1(x.flatten(1)))
            x = F.relu(self.fc2(x))
            return F.log_softmax(self.fc3(x), dim=1)

    class TinyNet(nn.Module):
        """Ray's parameter-server example's model (one 3x3 convolution, a 3x3 max-pool, one
        linear layer: 4 tensors), for tests that need many short jobs."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 3, kernel_size=3)
            self.fc = nn.Linear(192, 10)

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 3))
            return F.log_softmax(self.fc(x.view(-1, 192)), dim=1)

    return LeNet() if kind == "lenet" else TinyNet()


def checksum(model):
    h = hashlib.blake2b(digest_size=8)
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def accuracy(torch, model, x, y):
    with torch.no_grad():
        correct = 0
        for i in range(0, len(x), 1000):
            out = model(torch.from_numpy(x[i:i + 1000]))
            correct += int((out.argmax(1).numpy() == y[i:i + 1000]).sum())
    return 100.0 * correct / len(x)


def chainps_optim(chainps, a):
    if a.optimizer == "sgd":
        return chainps.SGD(a.lr)
    if a.optimizer == "momentum":
        return chainps.Momentum(a.lr, momentum=0.9)
    return chainps.Adam(a.lr)


def local_optimizer(torch, a, params):
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=a.lr)
    if a.optimizer == "momentum":
        return torch.optim.SGD(params, lr=a.lr, momentum=0.9)
    return torch.optim.Adam(params, lr=a.lr)


def main(argv):
    a = parse_args(argv)
    try:
        import chainps  # noqa: E402  (after argument errors, which need no library)
    except ImportError as e:
        sys.exit(f"train.py: cannot import the chainps package ({e}): build the project and "
                 f"set PYTHONPATH=BUILD/python (build/release/python after scripts/demo.sh), "
                 f"or install it with cmake --install")

    client = None
    if not a.local and not a.eval:
        # In a scheduler or server role this runs that role, then the process exits 0.
        client = chainps.init()
    import torch
    import chainps.torch as cpt

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = make_model(torch, a.model)
    xt, yt = load(a.data, "t10k")
    if a.eval:
        step = cpt.load_state_dict(model, a.eval)
        print(f"eval: {a.eval} at step {step}: test accuracy {accuracy(torch, model, xt, yt):.2f}%, "
              f"checksum {checksum(model)}", flush=True)
        return 0
    x, y = load(a.data, "train")
    rank, nw = (client.rank, client.num_workers) if client else (0, 1)
    lo, hi = rank * len(x) // nw, (rank + 1) * len(x) // nw
    x, y = x[lo:hi], y[lo:hi]
    per_epoch = len(x) // a.batch
    total = per_epoch * a.epochs
    if a.steps:
        total = min(total, a.steps)

    if client:
        # Chosen per tensor: a bias is too small for compression to pay.
        compress = (lambda name, p: a.compress if p.dim() > 1 else None) if a.compress else None
        hybrid = {"sync_every": a.sync_every}
        if a.allreduce:
            # No parameter on the servers: every one is all-reduced and stepped locally.
            hybrid = dict(on_servers=(), local_optim=lambda ps: local_optimizer(torch, a, ps),
                          sync_every=a.sync_every, warmup_steps=a.warmup)
        opt = cpt.DistributedOptimizer(model.named_parameters(), chainps_optim(chainps, a),
                                       client=client, seed=a.seed, overlap=not a.no_overlap,
                                       compress=compress, **hybrid)
        start = opt.start_step
        where = (f"all-reduced, sync every {a.sync_every}, warm-up {a.warmup}" if a.allreduce
                 else f"{client.num_servers} servers, sync every {a.sync_every}")
        print(f"worker {rank} of {nw}: mode {client.mode}, {where}, steps {start}..{total}",
              flush=True)
    else:
        # The servers' initial values, drawn locally: the same starting point as a job's.
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, p in params.items():
                init = cpt.default_init(name, p, params, a.seed)
                p.copy_(torch.from_numpy(chainps.init_values(init, 0, p.numel())).view_as(p))
        opt = local_optimizer(torch, a, model.parameters())
        start = 0
    loss_fn = torch.nn.functional.nll_loss
    t0 = time.monotonic()
    samples = 0
    loss = None
    epoch = -1
    order = None
    for step in range(start, total):
        e, i = divmod(step, per_epoch)
        if e != epoch:
            epoch = e
            order = np.random.default_rng([a.seed, e, rank]).permutation(len(x))
        idx = order[i * a.batch:(i + 1) * a.batch]
        xb, yb = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if a.slow_ms:
            time.sleep(a.slow_ms / 1000.0)
        opt.step()
        samples += len(idx)
        if a.log_every and (step + 1) % a.log_every == 0:
            print(f"epoch: {e + 1} step: {step + 1}, loss is {loss.item():.4f}", flush=True)
    elapsed = time.monotonic() - t0
    traffic = ""
    if client:
        if a.allreduce or a.sync_every != 1:
            # The training loop's traffic, before the final pull (bench/run_freq.sh reads it).
            # Only here: other runs' final lines end with the checksum, as scripts expect.
            st = client.stats()
            traffic = (f", pushed {st['push_wire_bytes']} bytes, pulled {st['pull_bytes']} "
                       f"bytes, all-reduce sent {st['allreduce_bytes_sent']} bytes")
        client.barrier()  # every worker's last step is in before the final pull
        opt.pull()
    acc = accuracy(torch, model, xt, yt)
    if a.save and rank == 0:
        torch.save(model.state_dict(), a.save)
    rate = samples / elapsed if elapsed > 0 else 0.0
    print(f"final: test accuracy {acc:.2f}%, {rate:.1f} samples/s, steps {total}, "
          f"checksum {checksum(model)}{traffic}", flush=True)
    if client:
        client.close()
    if loss is not None and not math.isfinite(loss.item()):
        print("train.py: the loss diverged", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
