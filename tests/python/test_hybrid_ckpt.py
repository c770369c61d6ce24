"""Checkpoints hold both halves of a hybrid job (issue 29): examples/hybrid's model trained a few
steps with periodic exports, then a fresh job restored from the newest one. The all-reduced
parameters and the local optimizer's state every restored worker starts from are bitwise those
in the export, and the same on both workers; `chainps.checkpoint.load` gives the whole
state_dict; a damaged or missing all-reduced tensor is refused naming it. With the table pushed
as rows (examples/hybrid's default split: no dense tensor on the servers), `--checkpoint-every N`
still writes a checkpoint every N steps, at the workers' step, and a job restored from one
resumes there. Every job is a
`chainps launch` bounded in time (loopback only)."""
import glob
import json
import os
import shutil
import struct
import sys
import zlib

import pytest
import torch

import chainps.checkpoint as ck
import torch_jobs as tj

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "hybrid_ckpt_job.py")
sys.path.insert(0, os.path.join(tj.ROOT, "examples", "hybrid"))
import train as hybrid  # noqa: E402

LOCAL = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def launch(args, job_args, timeout=200):
    cmd = [tj.cli(), "launch", "--timeout", str(timeout - 20), "--servers", "2", "--workers",
           "2", *args, "--", tj.PYTHON, JOB, *job_args]
    p = tj.subprocess.run(cmd, stdout=tj.subprocess.PIPE, stderr=tj.subprocess.STDOUT,
                          text=True, env=tj.env(), timeout=timeout)
    return p.returncode, p.stdout


def bits(t):
    return t.contiguous().view(torch.int32)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """The newest periodic checkpoint of a 2-worker hybrid job (a checkpoint every 40 steps)."""
    d = tmp_path_factory.mktemp("hybrid-ckpt")
    dump = d / "dump1"
    dump.mkdir()
    rc, out = launch(["--checkpoint-every", "40", "--checkpoint-dir", str(d / "ck"),
                      "--keep", "5"], ["--steps", "200", "--step-ms", "10", "--dump", str(dump)])
    assert rc == 0, out[-5000:]
    steps = sorted(glob.glob(str(d / "ck" / "step-*")))
    assert steps, "no periodic checkpoint was written:\n" + out[-5000:]
    return d, steps[-1]


def test_export_holds_both_halves(export):
    _, path = export
    meta = ck.metadata(path)
    assert meta["local/step"] == meta["step"], meta
    assert sorted(ck.local_names(path)) == sorted(
        LOCAL + [f"optim/local/{n}/momentum_buffer" for n in LOCAL])
    # The whole state_dict, strictly: the servers' table and the all-reduced layers.
    model = hybrid.Model(2000, 8)
    model.load_state_dict(ck.load(path), strict=True)
    # ... and the local optimizer's state in torch.optim's form.
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if n in LOCAL], lr=0.5,
                          momentum=0.9)
    opt.load_state_dict(ck.local_optimizer_state(path))
    assert len(opt.state) == len(LOCAL)


def test_restore_gives_every_worker_the_exported_bits(export):
    d, path = export
    step = ck.step(path)
    dump = d / "dump2"
    dump.mkdir()
    rc, out = launch(["--restore-from", path],
                     ["--steps", str(step + 20), "--step-ms", "0", "--dump", str(dump)])
    assert rc == 0, out[-5000:]
    local = ck.load_local(path)
    state = ck.local_optimizer_state(path, local)["state"]
    got = [torch.load(dump / f"rank-{r}.pt") for r in (0, 1)]
    for r, g in enumerate(got):
        assert g["start_step"] == step, (r, g["start_step"], step)
        for n in LOCAL:
            assert torch.equal(bits(g["params"][n]), bits(local[n])), (r, n)
        for i, slots in state.items():
            assert torch.equal(bits(g["optim"]["state"][i]["momentum_buffer"]),
                               bits(slots["momentum_buffer"])), (r, i)
    for n in LOCAL:
        assert torch.equal(bits(got[0]["params"][n]), bits(got[1]["params"][n])), n


def _rewrite(src, dst, edit):
    """Copy export `src` to directory `dst`, its safetensors file changed by edit(header,
    data)."""
    os.makedirs(dst)
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header["__metadata__"].pop("checksum/__header__", None)
    data = bytearray(raw[8 + n:])
    header, data = edit(header, data)
    # The header's checksum again (its own digits read as zeros: checkpoint/ckpt.h), so that
    # only what edit did is wrong.
    header["__metadata__"]["checksum/__header__"] = "crc32:00000000"
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    hb = hb.replace(b"crc32:00000000", f"crc32:{zlib.crc32(hb):08x}".encode(), 1)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + bytes(data))


def test_damaged_allreduced_tensor_is_named(export):
    d, path = export

    def flip(header, data):
        begin = header["fc1.bias"]["data_offsets"][0]
        data[begin + 1] ^= 0x40
        return header, data

    bad = str(d / "damaged")
    _rewrite(path, bad, flip)
    with pytest.raises(ck.CheckpointError, match="fc1.bias"):
        ck.load_local(bad)
    rc, out = launch(["--restore-from", bad], ["--steps", "5", "--dump", str(d)], timeout=120)
    assert rc != 0 and "fc1.bias" in out and "checksum" in out, out[-3000:]


def test_missing_allreduced_tensor_is_named(export):
    d, path = export

    def drop(header, data):
        # fc2.bias leaves the file; its kind/ mark stays, as a truncated export would have it.
        gone = header.pop("fc2.bias")
        header["__metadata__"].pop("checksum/fc2.bias")
        out, at = bytearray(), 0
        for name, e in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                              key=lambda kv: kv[1]["data_offsets"][0]):
            b, end = e["data_offsets"]
            out += data[b:end]
            e["data_offsets"] = [at, at + end - b]
            at += end - b
        assert gone
        return header, out

    bad = str(d / "missing")
    _rewrite(path, bad, drop)
    with pytest.raises(ck.CheckpointError, match="fc2.bias.*missing"):
        ck.load_local(bad)
    rc, out = launch(["--restore-from", bad], ["--steps", "5", "--dump", str(d)], timeout=120)
    assert rc != 0 and "fc2.bias" in out and "missing" in out, out[-3000:]


def test_adam_state_round_trip(tmp_path):
    """Adam's state (exp_avg, exp_avg_sq, and its 0-dim step, which travels as metadata) comes
    back bitwise and with its shapes on both workers."""
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d1.mkdir()
    d2.mkdir()
    rc, out = launch(["--checkpoint-every", "50", "--checkpoint-dir", str(tmp_path / "ck"),
                      "--keep", "5"], ["--adam", "--steps", "120", "--dump", str(d1)])
    assert rc == 0, out[-5000:]
    steps = sorted(glob.glob(str(tmp_path / "ck" / "step-*")))
    assert steps, out[-5000:]
    path = steps[-1]
    rc, out = launch(["--restore-from", path],
                     ["--adam", "--steps", str(ck.step(path) + 10), "--dump", str(d2)])
    assert rc == 0, out[-5000:]
    local = ck.load_local(path)
    state = ck.local_optimizer_state(path, local)["state"]
    assert set(state[0]) == {"exp_avg", "exp_avg_sq", "step"}, state[0].keys()
    for r in (0, 1):
        g = torch.load(d2 / f"rank-{r}.pt")
        for n in LOCAL:
            assert torch.equal(bits(g["params"][n]), bits(local[n])), (r, n)
        for i, slots in state.items():
            for k, v in slots.items():
                got = g["optim"]["state"][i][k]
                assert got.shape == v.shape and torch.equal(bits(got), bits(v)), (r, i, k)


def test_step_checkpoints_of_a_table_only_job(tmp_path):
    """The servers hold only the row-pushed table, so they have no step boundary: the periodic
    checkpoints take the workers' (cps_local_commit) and fire every N steps all the same."""
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d1.mkdir()
    d2.mkdir()
    rc, out = launch(["--checkpoint-every", "40", "--checkpoint-dir", str(tmp_path / "ck"),
                      "--keep", "5"], ["--table-only", "--steps", "130", "--step-ms", "10",
                                       "--dump", str(d1)])
    assert rc == 0, out[-5000:]
    steps = sorted(glob.glob(str(tmp_path / "ck" / "step-*")))
    got = [int(p.rsplit("-", 1)[1]) for p in steps]
    assert got and all(s % 40 == 0 for s in got), (got, out[-5000:])
    path = steps[-1]
    meta = ck.metadata(path)
    assert meta["step"] == meta["local/step"] == str(got[-1]), meta
    assert meta["cut"] == "the workers' step boundary" and meta["kind/embed.weight"] == "table"
    model = hybrid.Model(2000, 8)
    model.load_state_dict(ck.load(path), strict=True)
    rc, out = launch(["--restore-from", path],
                     ["--table-only", "--steps", str(got[-1] + 10), "--dump", str(d2)])
    assert rc == 0, out[-5000:]
    local = ck.load_local(path)
    for r in (0, 1):
        g = torch.load(d2 / f"rank-{r}.pt")
        assert g["start_step"] == got[-1], (r, g["start_step"])
        for n in LOCAL:
            assert torch.equal(bits(g["params"][n]), bits(local[n])), (r, n)


def test_table_only_job_resumes_at_the_local_step(tmp_path):
    """Only the embedding on the servers, as row pushes: the servers' cut is step 0 and the
    all-reduced half is taken at the worker's step S (local/step). The restored workers start
    their loop at S, not 0, and do not warm up again: their parameters are equal after every
    step."""
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    d1.mkdir()
    d2.mkdir()
    rc, out = launch(["--checkpoint-every", "1s", "--checkpoint-dir", str(tmp_path / "ck"),
                      "--keep", "10"], ["--table-only", "--warmup", "20", "--compare", "--steps", "400",
                                        "--step-ms", "10", "--dump", str(d1)])
    assert rc == 0, out[-5000:]
    assert (d1 / "apart-0.txt").read_text().split() == [str(s) for s in range(19)], \
        "the first job's workers must differ during their warm-up only"
    # Time-based, yet named step-N: the servers hold no dense tensor, so the export's step is the
    # workers' boundary. Newest last.
    exports = sorted((p for p in glob.glob(str(tmp_path / "ck" / "*-*"))
                      if ck.local_names(p) and int(ck.metadata(p)["local/step"]) > 20),
                     key=lambda p: int(ck.metadata(p)["local/step"]))
    assert exports, "no time-based export past the warm-up:\n" + out[-5000:]
    path = exports[-1]
    meta = ck.metadata(path)
    at = int(meta["local/step"])
    # The servers hold no dense tensor: the export's step is the workers' boundary.
    assert meta["step"] == meta["local/step"], meta
    rc, out = launch(["--restore-from", path],
                     ["--table-only", "--warmup", "20", "--compare", "--steps", str(at + 10),
                      "--step-ms", "0", "--dump", str(d2)])
    assert rc == 0, out[-5000:]
    local = ck.load_local(path)
    for r in (0, 1):
        g = torch.load(d2 / f"rank-{r}.pt")
        assert g["start_step"] == at, (r, g["start_step"], at)
        for n in LOCAL:
            assert torch.equal(bits(g["params"][n]), bits(local[n])), (r, n)
        apart = (d2 / f"apart-{r}.txt").read_text().split()
        assert apart == [], f"rank {r}: restored workers differ after steps {apart} (warm-up again)"


@pytest.mark.parametrize("servers", [["--table-only"], []], ids=["rows", "dense"])
def test_replacement_gets_the_local_optimizer_state(tmp_path, servers):
    """A worker killed -9 under --restart-workers: its replacement copies the all-reduced
    parameters and the local optimizer's state (SGD's momentum) from the live worker, so after
    its first step both workers hold the same bits of both (without the momentum it would start
    from none and differ from then on). With the table as row pushes (as in test_hybrid.py's
    replacement test) the servers have no step boundary; with every server tensor pushed dense
    each step is also a sync step of the servers, which the replacement must join at the step
    the live worker is on (or the two wait on each other until the all-reduce times out)."""
    cmd = [tj.cli(), "launch", "--timeout", "200", "--servers", "2", "--workers", "2",
           "--restart-workers", "--", tj.PYTHON, JOB, *servers, "--compare", "--steps", "600",
           "--step-ms", "5", "--dump", str(tmp_path)]
    rc, out = tj.launch_killing_worker(cmd, tmp_path / "launch.log", "rank 1 step 100",
                                       timeout=220)
    assert rc == 0 and out.count("hybrid_ckpt_job: OK") == 2, out[-5000:]
    assert "restarted worker 1" in out, out[-5000:]
    g = torch.load(tmp_path / "rank-1.pt")
    assert g["start_step"] > 100, g["start_step"]
    assert [sorted(s) for s in g["optim"]["state"].values()] == [["momentum_buffer"]] * 4, \
        g["optim"]["state"]
    for r in (0, 1):
        apart = (tmp_path / f"apart-{r}.txt").read_text().split()
        assert apart == [], f"rank {r}: the workers differ after steps {apart}"

