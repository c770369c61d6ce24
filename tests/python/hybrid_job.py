#!/usr/bin/python3
"""A worker of test_hybrid.py: checks DistributedOptimizer's hybrid placement and its two
optimizers inside a 2-worker job, and prints "hybrid_job: OK rank R checksum C"."""
import gc
import hashlib
import weakref

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


def grads_to_none(client, rank, lr):
    """The program clears gradients itself with zero_grad(set_to_none=True) (the model's, as
    torch 2's default does), and on rank 1 every other step leaves `b` out of the graph (its
    grads stay None). Backward must add into the optimizer's flat gradient buffer in place
    (p.grad is its view after backward: nothing allocated or copied per step, the buffer never
    moves), and a gradient left None counts as zeros on that worker, so the workers still
    apply the same mean and hold the same bits."""
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    model = torch.nn.ModuleDict({"a": a, "b": b})
    o = chainps.torch.DistributedOptimizer(
        model.named_parameters(), chainps.SGD(lr), client=client, prefix="none/",
        on_servers=lambda n, p: False, local_optim=lambda ps: torch.optim.SGD(ps, lr=lr))
    params = [p for _, p in model.named_parameters()]
    buf = o._grads.data_ptr()
    for i in range(6):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 * rank + i))
        model.zero_grad(set_to_none=True)
        use_b = rank == 0 or i % 2 == 0
        loss = a(x).pow(2).sum() + (b(x).pow(2).sum() if use_b else 0)
        loss.backward()
        for p, view in zip(params, o._gviews):
            if p.grad is None:
                assert not use_b and any(p is q for q in b.parameters()), "a grad left None"
            else:
                assert p.grad.data_ptr() == view.data_ptr(), \
                    f"step {i}: backward put the gradient outside the flat buffer"
        mine = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        mean = mine.clone()
        client.allreduce(mean, "mean")
        before = torch.cat([p.detach().reshape(-1) for p in params])
        o.step()
        after = torch.cat([p.detach().reshape(-1) for p in params])
        assert torch.allclose(after, before - lr * mean, atol=1e-6), \
            f"step {i}: a None gradient was not a zero contribution"
        assert o._grads.data_ptr() == buf, f"step {i}: the gradient buffer moved"
        twice = after.clone()
        client.allreduce(twice, "sum")
        assert torch.equal(twice, after * 2), f"step {i}: workers differ"


def hooks_do_not_pile_up(client, rank, lr):
    """Two optimizers over one model in turn, the first closed (its step() and zero_grad() then
    raise), then the first dropped without close() and collected: a backward after a zero_grad(set_to_none=True) lands in the live
    optimizer's flat buffer only (the old one's hook is gone: its buffer keeps a sentinel), and
    the old optimizer and its buffer are freed (no hook keeps them alive)."""
    model = torch.nn.Linear(4, 3)
    params = list(model.parameters())
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(rank))

    def make(prefix):
        return chainps.torch.DistributedOptimizer(
            model.named_parameters(), chainps.SGD(lr), client=client, prefix=prefix,
            on_servers=lambda n, p: False, local_optim=lambda ps: torch.optim.SGD(ps, lr=lr))

    for how in ("close", "collect"):
        old = make(f"{how}1/")
        old_buf = old._grads
        gone, buf_gone = weakref.ref(old), weakref.ref(old_buf)
        if how == "close":
            old.close()
            old.close()  # a second close does nothing
            for call in ("step", "zero_grad"):  # names: a bound method would keep `old` alive
                try:
                    getattr(old, call)()
                except RuntimeError as e:
                    assert "after close()" in str(e), e
                else:
                    raise AssertionError(f"{call}() after close() was accepted")
        new = make(f"{how}2/")
        if how == "collect":
            del old
            gc.collect()
        want = torch.autograd.grad(model(x).pow(2).sum(), params)
        old_buf.fill_(7.0)
        model.zero_grad(set_to_none=True)
        model(x).pow(2).sum().backward()
        for p, view, w in zip(params, new._gviews, want):
            assert p.grad is view, f"{how}: backward did not land in the live optimizer's buffer"
            assert torch.equal(view, w), f"{how}: wrong gradient in the live optimizer's buffer"
        assert bool((old_buf == 7.0).all()), f"{how}: a stale optimizer's hook still acts"
        assert len(params[0]._backward_hooks) == 1, f"{how}: hooks pile up"
        del old_buf
        if how == "close":
            del old
        gc.collect()
        assert gone() is None, f"{how}: the dropped optimizer is still alive"
        assert buf_gone() is None, f"{how}: the dropped optimizer's buffer is still alive"
        new.close()
        del new
        gc.collect()


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
    # Warm-up and communication frequency on an all-reduced model of its own.
    small = torch.nn.Linear(8, 4)
    o3 = chainps.torch.DistributedOptimizer(
        small.named_parameters(), chainps.SGD(lr), client=client, prefix="small/",
        on_servers=lambda n, p: False, local_optim=lambda ps: torch.optim.SGD(ps, lr=lr,
                                                                              momentum=0.9),
        warmup_steps=3, sync_every=4)

    def same_everywhere():
        v = torch.cat([small.weight.detach().reshape(-1), small.bias.detach()])
        twice = v.clone()
        client.allreduce(twice, "sum")
        return torch.equal(twice, v * 2)

    def small_step(i):
        xs = torch.randn(16, 8, generator=torch.Generator().manual_seed(100 * rank + i))
        o3.zero_grad()
        small(xs).pow(2).mean().backward()
        before = small.weight.detach().clone()
        o3.step()
        return not torch.equal(before, small.weight.detach())

    assert small_step(0) and small_step(1), "warm-up steps are local optimizer steps"
    assert not same_everywhere(), "workers trained on their own data must differ in warm-up"
    assert small_step(2) and same_everywhere(), "the first synchronisation averages them"
    for i in range(3, 11):
        moved = small_step(i)
        assert moved == ((i - 3) % 4 == 3), f"step {i}: sync_every=4 steps every 4th only"
        assert same_everywhere(), f"step {i}: workers differ"

    # Bounds as the C API's (cps_freq): refused before anything is declared.
    for bad in ({"sync_every": 0}, {"sync_every": (1 << 20) + 1}, {"warmup_steps": -1}):
        try:
            chainps.torch.DistributedOptimizer(
                small.named_parameters(), chainps.SGD(lr), client=client, prefix="bad/",
                on_servers=lambda n, p: False, **bad)
        except ValueError as e:
            assert "must be" in str(e), e
        else:
            raise AssertionError(f"{bad} was accepted")
    # Windows end on the job's step, not on the process's count: a worker that starts at job
    # step 2 (as a replacement or a restored job does) syncs at step 3 with the others, then
    # every 4th.
    o4 = chainps.torch.DistributedOptimizer(
        small.named_parameters(), chainps.SGD(lr), client=client, prefix="small4/",
        on_servers=lambda n, p: False, local_optim=lambda ps: torch.optim.SGD(ps, lr=lr),
        sync_every=4)
    o4.start_step = 2
    o3 = o4
    for i in range(6):
        moved = small_step(i)
        assert moved == (i in (1, 5)), f"job step {2 + i}: sync_every=4 ends windows at 3 and 7"
        assert same_everywhere(), f"job step {2 + i}: workers differ"

    grads_to_none(client, rank, lr)
    hooks_do_not_pile_up(client, rank, lr)

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
