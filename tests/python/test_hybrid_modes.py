"""Hybrid checkpoints outside sync mode (issue 29): a hybrid job in `--mode async` and
`--mode ssp:2` takes periodic exports and a fresh job is restored from the newest one. Apart
from test_hybrid_ckpt.py (sync) so that each ctest stays well inside its time bound on a loaded
machine. Every job is a `chainps launch` bounded in time (loopback only)."""
import glob

import pytest
import torch

import chainps.checkpoint as ck
from test_hybrid_ckpt import LOCAL, bits, hybrid, launch


@pytest.mark.parametrize("mode", ["async", "ssp:2"])
def test_async_and_ssp_exports_hold_both_halves_and_restore(tmp_path, mode):
    """Hybrid exports outside sync mode. The servers' tensors apply each push on arrival, so
    their values depend on timing and are not compared bitwise; what holds is checked: the
    export has both halves (the table and dense tensors of the servers, the all-reduced layers
    and their momentum), `chainps.checkpoint.load` gives a state_dict that loads strictly, the
    step of the all-reduced half is recorded, and a job restored from it in the same mode gives
    both workers exactly the exported all-reduced bits (that half is the same on every worker
    whatever the mode), starts at or after the recorded step, and trains on to the end."""
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d1.mkdir()
    d2.mkdir()
    rc, out = launch(["--mode", mode, "--checkpoint-every", "1s", "--checkpoint-dir",
                      str(tmp_path / "ck"), "--keep", "10"],
                     ["--steps", "300", "--step-ms", "10", "--dump", str(d1)])
    assert rc == 0 and out.count("hybrid_ckpt_job: OK") == 2, out[-5000:]
    exports = sorted((p for p in glob.glob(str(tmp_path / "ck" / "*-*")) if ck.local_names(p)),
                     key=lambda p: int(ck.metadata(p)["local/step"]))
    assert exports, "no export holds the all-reduced half:\n" + out[-5000:]
    path = exports[-1]
    meta = ck.metadata(path)
    at = int(meta["local/step"])
    assert 0 < at <= 300, meta
    assert sorted(ck.local_names(path)) == sorted(
        LOCAL + [f"optim/local/{n}/momentum_buffer" for n in LOCAL])
    sd = ck.load(path)
    assert sorted(sd) == sorted(["embed.weight"] + LOCAL), sorted(sd)
    model = hybrid.Model(2000, 8)
    model.load_state_dict(sd, strict=True)
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if n in LOCAL], lr=0.5,
                          momentum=0.9)
    opt.load_state_dict(ck.local_optimizer_state(path))
    assert len(opt.state) == len(LOCAL)
    rc, out = launch(["--mode", mode, "--restore-from", path],
                     ["--steps", str(at + 20), "--step-ms", "0", "--dump", str(d2)])
    assert rc == 0 and out.count("hybrid_ckpt_job: OK") == 2, out[-5000:]
    local = ck.load_local(path)
    for r in (0, 1):
        g = torch.load(d2 / f"rank-{r}.pt")
        assert at <= g["start_step"] < at + 20, (r, g["start_step"], at)
        for n in LOCAL:
            assert torch.equal(bits(g["params"][n]), bits(local[n])), (r, n)
