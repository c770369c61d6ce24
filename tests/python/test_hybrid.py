"""Hybrid PS + AllReduce (issue 29): DistributedOptimizer's placement, its two optimizers and the
same parameters on both workers (hybrid_job.py), and examples/hybrid in both placements, each in
a 2-worker `chainps launch` job bounded in time."""
import os
import re

import pytest

import torch_jobs as tj

pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(tj.ROOT, "examples", "hybrid", "train.py")


def launch(program, args, timeout=240):
    cmd = [tj.cli(), "launch", "--timeout", str(timeout - 20), "--servers", "2", "--workers",
           "2", "--", tj.PYTHON, program, *args]
    p = tj.subprocess.run(cmd, stdout=tj.subprocess.PIPE, stderr=tj.subprocess.STDOUT,
                          text=True, env=tj.env(), timeout=timeout)
    return p.returncode, p.stdout


def test_placement_two_optimizers_and_equal_parameters():
    rc, out = launch(os.path.join(HERE, "hybrid_job.py"), [])
    ok = re.findall(r"hybrid_job: OK rank (\d) checksum ([0-9a-f]+)", out)
    assert rc == 0 and len(ok) == 2, out[-5000:]
    assert ok[0][1] == ok[1][1], f"the workers ended with different parameters: {ok}"


@pytest.mark.parametrize("placement", ["hybrid", "servers"])
def test_example_trains_and_workers_agree(placement):
    rc, out = launch(EXAMPLE, ["--placement", placement, "--steps", "300", "--vocab", "5000",
                               "--lr", "2", "--log-every", "100"])
    f = tj.finals(out)
    assert rc == 0 and len(f) == 2, out[-5000:]
    assert f[0][2] == f[1][2], f"workers differ: {f}"
    assert f[0][0] > 60.0, f"test accuracy {f[0][0]}% after 300 steps"
