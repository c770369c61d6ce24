#!/usr/bin/python3
"""A worker of test_hybrid.py: checks DistributedOptimizer's hybrid placement and its two
optimizers inside a 2-worker job, and prints "hybrid_job: OK rank R checksum C"."""
import hashlib

import torch

import chainps
import chainps.torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 8, sparse=True)
        self.big = torch.nn.Linear(300, 300)   # 90,300 values: over the default threshold
        self.fc = torch.nn.Linear(8, 1)

    def forward(self, ids, z):
        return self.fc(self.embed(ids)).squeeze(1) + self.big(z).sum(1)


def main():
    client = chainps.init()
    rank = client.rank
    torch.manual_seed(10 + rank)  # different local values: rank 0's must win
    net = Net()
    lr = 0.1
    opt = chainps.torch.DistributedOptimizer(
        net.named_parameters(), chainps.SGD(lr), client=client,
        local_optim=lambda ps: torch.optim.SGD(ps, lr=lr))
    pl = opt.placement()
    assert pl == {"servers": ["embed.weight", "big.weight"],
                  "allreduce": ["big.bias", "fc.weight", "fc.bias"]}, pl
    # The all-reduced parameters start from rank 0's values on every worker.
    start = torch.cat([net.fc.weight.detach().reshape(-1), net.fc.bias.detach(),
                       net.big.bias.detach()])
    check = start.clone()
    client.allreduce(check, "sum")
    assert torch.equal(check, start * 2), "workers start from different dense values"

    # One step: the local optimizer applies the mean of the workers' gradients.
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, 1000, (16,), generator=g)
    z = torch.randn(16, 300, generator=g)
    y = torch.randn(16, generator=g)
    emb_before = net.embed.weight.detach().clone()  # its rows move during backward()
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(ids, z), y).backward()
    mine = net.fc.weight.grad.detach().clone()
    mean = mine.clone()
    client.allreduce(mean, "mean")
    before = net.fc.weight.detach().clone()
    opt.step()
    assert torch.allclose(net.fc.weight.detach(), before - lr * mean, atol=1e-6), \
        "the local optimizer did not apply the mean gradient"
    touched = torch.unique(ids)
    assert not torch.equal(net.embed.weight.detach()[touched], emb_before[touched]), \
        "the servers' optimizer did not update the embedding rows this worker pushed"

    # By name and by predicate.
    for on in (["fc.weight"], lambda n, p: n == "fc.weight"):
        o2 = chainps.torch.DistributedOptimizer(
            net.named_parameters(), chainps.SGD(lr), client=client, prefix="t2/" if
            isinstance(on, list) else "t3/", on_servers=on, overlap=False,
            local_optim=lambda ps: torch.optim.SGD(ps, lr=lr))
        p2 = o2.placement()
        assert p2["servers"][0].endswith("fc.weight") and len(p2["servers"]) == 1, p2
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(ids, z), y).backward()
        opt.step()
    client.barrier()
    opt.pull()
    h = hashlib.blake2b(digest_size=8)
    for _, p in sorted(net.named_parameters()):
        h.update(p.detach().numpy().tobytes())
    print(f"hybrid_job: OK rank {rank} checksum {h.hexdigest()}", flush=True)
    client.barrier()
    client.close()


if __name__ == "__main__":
    main()
