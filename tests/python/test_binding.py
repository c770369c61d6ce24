"""The chainps Python binding against a real job: a scheduler and a server started here (on
127.0.0.1, ended by their PIDs), this test process joining as the job's only worker. Values are
checked exactly (SGD with lr 0.5 on small integers is exact in float32)."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import torch_jobs as tj

import chainps

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("job"))
    c = tj.Cluster(tmp, servers=1, workers=1)
    saved = dict(os.environ)
    os.environ.update({"CHAINPS_ROLE": "worker", "CHAINPS_SCHEDULER": c.addr,
                       "CHAINPS_SECRET_FILE": tj.secret_file()})
    try:
        cl = chainps.init()
        yield cl
        cl.close()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        c.close()


SGD = chainps.SGD(0.5)


def test_job_facts(client):
    assert (client.rank, client.num_workers, client.num_servers) == (0, 1, 1)
    assert client.mode == "sync" and client.staleness == 0
    assert isinstance(chainps.__version__, str) and chainps.__version__.count(".") == 2


def test_declare_push_pull_exact(client):
    t = client.declare("exact", (4, 3), init=chainps.Init.constant(1.0), optim=SGD)
    assert t.shape == (4, 3) and t.numel == 12 and t.name == "exact" and not t.is_table
    out = np.zeros(12, np.float32)
    client.pull(t, out)
    assert (out == 1.0).all()
    g = np.arange(12, dtype=np.float32)
    client.push(t, g)
    client.pull(t, out)
    np.testing.assert_array_equal(out, 1.0 - 0.5 * g)
    client.push_pull(t, g, out)
    np.testing.assert_array_equal(out, 1.0 - g)
    assert t.step == 2


def test_torch_tensors_are_read_and_written_in_place(client):
    t = client.declare("torch", 6, init=chainps.Init.constant(2.0), optim=SGD)
    out = torch.zeros(2, 3)
    ptr = out.data_ptr()
    client.pull(t, out)
    assert out.data_ptr() == ptr and bool((out == 2.0).all())
    grad = torch.arange(6, dtype=torch.float32)
    h = client.push_pull_async(t, grad, out)
    h.wait()
    assert h.done()
    assert out.view(-1).tolist() == [2.0 - 0.5 * i for i in range(6)]
    # A parameter that requires grad, through .data, as chainps.torch passes it.
    p = torch.nn.Parameter(torch.zeros(6))
    client.pull(t, p.data)
    assert p.data.tolist() == out.view(-1).tolist()


def test_async_handles(client):
    t = client.declare("async", 1000, init=chainps.Init.zeros(), optim=SGD)
    g = np.ones(1000, np.float32)
    hs = [client.push_async(t, g) for _ in range(3)]
    for h in hs:
        h.wait(timeout=30)
    out = np.zeros(1000, np.float32)
    client.pull_async(t, out).wait()
    np.testing.assert_array_equal(out, -1.5)
    with pytest.raises(ValueError, match="timeout"):
        client.pull_async(t, out).wait(timeout=-1)
    del hs
    h = client.pull_async(t, out)
    del h  # dropped before completion: its buffer stays alive until the library is done
    client.barrier()


def test_rows(client):
    t = client.declare_table("emb", 10, 4, init=chainps.Init.constant(1.0), optim=SGD)
    assert t.is_table and t.shape == (10, 4)
    client.rows_push(t, [3, 7], np.ones(8, np.float32))
    out = np.zeros(12, np.float32)
    client.rows_pull(t, np.array([3, 0, 7], dtype=np.int64), out)
    np.testing.assert_array_equal(out, [0.5] * 4 + [1.0] * 4 + [0.5] * 4)
    with pytest.raises(ValueError, match="2 rows of 4 values need 8"):
        client.rows_push(t, [1, 2], np.ones(7, np.float32))
    with pytest.raises(chainps.Error) as e:
        client.rows_pull(t, [10], np.zeros(4, np.float32))
    assert e.value.code == chainps.CPS_ENOTFOUND and e.value.name == "CPS_ENOTFOUND"
    with pytest.raises(TypeError, match="not a table"):
        client.rows_pull(client.declare("dense_r", 4), [0], np.zeros(4, np.float32))


def test_bad_input_is_an_exception_naming_the_tensor(client):
    t = client.declare("bad", 12, optim=SGD)
    cases = [
        (np.zeros(12), TypeError, "bad: gradient must hold float32 values .got float64"),
        (np.zeros(12, np.int64), TypeError, "float32"),
        (np.zeros(24, np.float32)[::2], ValueError, "not C-contiguous"),
        (np.zeros(5, np.float32), ValueError, "gradient has 5 values, the tensor has 12"),
        (torch.zeros(12, dtype=torch.float64), TypeError, "torch.float32, not torch.float64"),
        (torch.zeros(12, dtype=torch.int64), TypeError, "torch.float32"),
        (torch.zeros(24)[::2], ValueError, "not a contiguous"),
        ([1.0] * 12, TypeError, "numpy array, a torch CPU tensor"),
        (torch.zeros(12, device="meta"), TypeError, "CPU tensors only"),
    ]
    for buf, exc, text in cases:
        with pytest.raises(exc, match=text):
            client.push(t, buf)
    ro = np.zeros(12, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        client.pull(t, ro)
    for shape in [(0,), (), tuple([1] * 9), -3]:
        with pytest.raises(ValueError):
            client.declare("badshape", shape)
    client.declare("reshaped", (3, 4))
    with pytest.raises(chainps.Error) as e:
        client.declare("reshaped", (4, 3))
    assert e.value.code == chainps.CPS_EEXIST
    with pytest.raises(TypeError):
        client.declare("x", 4, init="zeros")
    with pytest.raises(chainps.Error) as e:
        client.declare("badlr", 4, optim=chainps.SGD(-1.0))
    assert e.value.code == chainps.CPS_EINVAL
    # After all that the job still serves.
    out = np.zeros(12, np.float32)
    client.pull(t, out)


def test_an_absurd_size_is_refused_at_declare_time(client):
    # 2^40 values (4 TB): refused on the worker at once, naming the tensor and the limit, where
    # it used to spin laying out millions of chunks (issue 27). The job keeps serving.
    t0 = time.monotonic()
    for shape in [(1 << 20, 1 << 20), 1 << 40]:
        with pytest.raises(chainps.Error) as e:
            client.declare("huge", shape)
        assert e.value.code == chainps.CPS_EINVAL
    with pytest.raises(chainps.Error):
        client.declare_table("huge_table", 1 << 32, 1024)
    assert time.monotonic() - t0 < 5
    t = client.declare("after_huge", 4, optim=SGD)
    out = np.zeros(4, np.float32)
    client.pull(t, out)


def test_init_values_match_the_servers(client):
    init = chainps.Init.normal(0.0, 0.05, seed=42)
    t = client.declare("initv", 5000, init=init, optim=SGD)
    out = np.zeros(5000, np.float32)
    client.pull(t, out)
    np.testing.assert_array_equal(out, chainps.init_values(init, 0, 5000))
    assert abs(float(out.std()) - 0.05) < 0.005


def test_threads_share_a_client(client):
    ts = [client.declare(f"thr{i}", 256, optim=SGD) for i in range(4)]
    errors = []

    def work(t):
        try:
            out = np.zeros(256, np.float32)
            for _ in range(20):
                client.push_pull(t, np.ones(256, np.float32), out)
            assert (out == -10.0).all()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = [threading.Thread(target=work, args=(t,)) for t in ts]
    for x in th:
        x.start()
    for x in th:
        x.join(60)
    assert not errors


def test_compress_per_tensor(client):
    t = client.declare("lossy", 64, optim=chainps.SGD(0.5))
    w0 = np.empty(64, dtype=np.float32)
    client.pull(t, w0)
    g = (np.arange(64, dtype=np.float32) % 4) * 0.25  # exact in fp16
    client.compress(t, "fp16")
    s0 = client.stats()
    client.push(t, g)
    s1 = client.stats()
    assert s1["push_wire_bytes"] - s0["push_wire_bytes"] < s1["push_raw_bytes"] - s0["push_raw_bytes"]
    w = np.empty(64, dtype=np.float32)
    client.pull(t, w)
    assert np.array_equal(w, w0 - np.float32(0.5) * g)
    client.compress(t, "topk:0.5")  # 32 values a push: two pushes send all of g
    client.push(t, g)
    client.push(t, np.zeros(64, dtype=np.float32))
    client.pull(t, w)
    assert np.array_equal(w, (w0 - np.float32(0.5) * g) - np.float32(0.5) * g)
    client.compress(t, "none")
    with pytest.raises(ValueError, match="lossy.*not a gradient codec"):
        client.compress(t, "fp8")
    with pytest.raises(TypeError):
        client.compress("lossy", "fp16")


def test_stats_move(client):
    s = client.stats()
    t = client.declare("stats", 100)
    client.push(t, np.ones(100, np.float32))
    s2 = client.stats()
    assert s2["pushes"] > s["pushes"] and s2["push_raw_bytes"] >= s["push_raw_bytes"] + 400


def test_stats_count_allreduces(client):
    # One worker: the all-reduce completes with nobody to send to, and is counted.
    s = client.stats()
    x = np.full(10, 3.0, np.float32)
    client.allreduce(x, "mean")
    s2 = client.stats()
    assert (x == 3.0).all()
    assert s2["allreduces"] == s["allreduces"] + 1
    assert s2["allreduce_bytes_sent"] == s["allreduce_bytes_sent"]


def test_freq_accumulates_in_place_and_refuses_bad_settings(client):
    # cps_freq through the binding, one worker: k = 2 after a warm-up of 1. The schedule reads
    # and writes the caller's buffers (numpy here) in place.
    g = np.zeros(3, np.float32)
    w = np.ones(3, np.float32)
    f = client.freq([g], [w], sync_every=2, warmup_steps=1)
    seen = []
    for step in range(5):
        g[:] = [step + 1.0, 2.0 * (step + 1), -1.0]
        seen.append((f.step, f.grad(), g.copy()))
        assert f.step_end() == (step == 0)  # the warm-up's average, at its last step
    assert [s for s, _, _ in seen] == [0, 1, 2, 3, 4]
    assert [a for _, a, _ in seen] == [True, False, True, False, True]
    # Step 2 ends the window of steps 1 and 2: their mean, written back into g.
    assert seen[2][2].tolist() == [2.5, 5.0, -1.0]
    assert seen[1][2].tolist() == [2.0, 4.0, -1.0]  # held: the buffer is untouched
    assert f.stats() == {"steps": 5, "syncs": 2, "held": 2, "averaged": 1}
    # Windows end on the job's step (1, 3, 5, ...): one starting at step 2 syncs at step 3.
    f2 = client.freq([g], sync_every=2, start_step=2)
    assert f2.grad() is False and f2.step_end() is False and f2.grad() is True
    for bad in ({"sync_every": 0}, {"sync_every": (1 << 20) + 1}, {"warmup_steps": -1},
                {"warmup_steps": 1}):  # a warm-up needs state buffers
        with pytest.raises(ValueError, match="must be"):
            client.freq([g], **bad)
    with pytest.raises(ValueError, match="empty"):
        client.freq([np.zeros(0, np.float32)])
    with pytest.raises(TypeError):
        client.freq([np.zeros(3, np.float64)])
    # Called twice without step_end: the library refuses it.
    f3 = client.freq([g])
    f3.grad()
    with pytest.raises(chainps.Error):
        f3.grad()


def _worker_script(cluster, code, **env):
    """Run python `code` as a worker of `cluster` (with `env` added); its CompletedProcess. The
    cluster is closed afterwards, and every process of it ended."""
    env = tj.env(CHAINPS_ROLE="worker", CHAINPS_SCHEDULER=cluster.addr, **env)
    try:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
    finally:
        cluster.close()


def test_closed_client_refuses_calls(tmp_path):
    c = tj.Cluster(str(tmp_path), servers=1, workers=1, mode="async")
    code = ("import chainps, numpy as np\n"
            "c = chainps.init(); t = c.declare('w', 4); assert c.mode == 'async'\n"
            "c.close(); assert c.closed\n"
            "try:\n    c.pull(t, np.zeros(4, np.float32))\nexcept ValueError as e:\n"
            "    print('refused:', e)\n")
    r = _worker_script(c, code)
    assert r.returncode == 0, r.stderr
    assert "refused: pull: chainps client is closed" in r.stdout


@pytest.mark.parametrize("role_env", [
    {"CHAINPS_ROLE": "server"},
    {"MS_ROLE": "MS_PSERVER"},
])
def test_init_runs_a_server_role_and_exits_0(tmp_path, role_env):
    """One script for every role: chainps.init() as a server serves the job, then exits 0."""
    port = tj.free_port()
    env = dict(role_env, CHAINPS_DATA_DIR=str(tmp_path / "d"))
    if "MS_ROLE" in role_env:
        env.update(MS_SCHED_HOST="127.0.0.1", MS_SCHED_PORT=port, MS_SERVER_NUM=1,
                   MS_WORKER_NUM=1)
    else:
        env["CHAINPS_SCHEDULER"] = f"127.0.0.1:{port}"
    sched = server = None
    try:
        sched = subprocess.Popen(
            [tj.cli(), "scheduler", "--servers", "1", "--workers", "1", "--port", str(port),
             "--bind", "127.0.0.1", "--data", str(tmp_path / "s")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=tj.env())
        server = subprocess.Popen([sys.executable, "-c",
                                   "import chainps; print('before', flush=True); "
                                   "chainps.init(); print('never here')"],
                                  env=tj.env(**env), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        worker = subprocess.run(
            [sys.executable, "-c",
             "import chainps, numpy as np\n"
             "c = chainps.init(); t = c.declare('w', 3, optim=chainps.SGD(1.0))\n"
             "o = np.zeros(3, np.float32); c.push_pull(t, np.ones(3, np.float32), o)\n"
             "assert (o == -1).all(), o\nc.close()\n"],
            env=tj.env(CHAINPS_ROLE="worker", CHAINPS_SCHEDULER=f"127.0.0.1:{port}"),
            capture_output=True, text=True, timeout=60)
        out, _ = server.communicate(timeout=30)
        sched.wait(timeout=30)
    finally:
        tj.kill_all((server, sched))
    assert worker.returncode == 0, worker.stderr
    assert server.returncode == 0, out
    assert "before" in out and "never here" not in out


def test_ctrl_c_interrupts_a_blocked_call(tmp_path):
    """A sync push that waits for a worker which does not push is interrupted by SIGINT:
    KeyboardInterrupt in the caller, and the process still closes and exits in bounded time."""
    import signal
    import time

    c = tj.Cluster(str(tmp_path), servers=1, workers=2)
    env = tj.env(CHAINPS_ROLE="worker", CHAINPS_SCHEDULER=c.addr)
    blocked = ("import chainps, numpy as np, time\n"
               "c = chainps.init(); t = c.declare('w', 4)\n"
               "print('pushing', flush=True)\n"
               "t0 = time.monotonic()\n"
               "try:\n    c.push(t, np.ones(4, np.float32))\n"
               "except KeyboardInterrupt:\n"
               "    print(f'interrupted after {time.monotonic() - t0:.1f} s', flush=True)\n"
               "c.close(); print('closed', flush=True)\n")
    idle = ("import chainps, time\n"
            "c = chainps.init(); t = c.declare('w', 4); time.sleep(8); c.close()\n")
    a = b = None
    try:
        a = subprocess.Popen([sys.executable, "-c", blocked], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        b = subprocess.Popen([sys.executable, "-c", idle], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        line = "-"
        while line and "pushing" not in line:  # the library logs its joining first
            line = a.stdout.readline()
        assert line, "the worker ended before its push"
        time.sleep(1.0)
        a.send_signal(signal.SIGINT)
        out, _ = a.communicate(timeout=60)
        b.wait(timeout=60)
    finally:
        tj.kill_all((a, b))
        c.close()
    assert "interrupted after" in out and "closed" in out, out
    assert a.returncode == 0, out


# ---- errors say why (issue 27): chainps.Error carries the reason the library logged ----------

def _init_fails(monkeypatch, **env):
    """chainps.init() as a worker of `env` (the job variables of this process removed first);
    returns the chainps.Error it raises."""
    for k in list(os.environ):
        if k.startswith(("CHAINPS_", "DMLC_", "MS_")) and k != "CHAINPS_CLI":
            monkeypatch.delenv(k)
    for k, v in dict({"CHAINPS_ROLE": "worker"}, **env).items():
        monkeypatch.setenv(k, str(v))
    with pytest.raises(chainps.Error) as e:
        chainps.init().close()
    assert e.value.reason and str(e.value).endswith(e.value.reason), str(e.value)
    return e.value


def test_error_says_the_secret_is_missing_and_how_to_give_it(monkeypatch):
    e = _init_fails(monkeypatch, CHAINPS_SCHEDULER="127.0.0.1:9")
    assert e.code == chainps.CPS_ECONFIG and e.name == "CPS_ECONFIG"
    assert str(e).startswith("chainps.init: bad configuration (CPS_ECONFIG): no job secret: ")
    assert "CHAINPS_SECRET_FILE=FILE" in str(e) and "--secret-file" in str(e)


def test_error_says_the_secret_file_is_open_to_others(monkeypatch, tmp_path):
    path = tmp_path / "open.secret"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    path.chmod(0o644)
    e = _init_fails(monkeypatch, CHAINPS_SCHEDULER="127.0.0.1:9", CHAINPS_SECRET_FILE=path)
    assert e.code == chainps.CPS_ECONFIG
    assert f"the secret file {path} is open to other users (mode 0644): chmod 600 it" in str(e)


def test_error_says_the_scheduler_is_unreachable_after_n_seconds(monkeypatch):
    port = tj.free_port()  # nothing listens there
    e = _init_fails(monkeypatch, CHAINPS_SCHEDULER=f"127.0.0.1:{port}",
                    CHAINPS_SECRET_FILE=tj.secret_file(), CHAINPS_JOIN_TIMEOUT_MS=1500)
    assert isinstance(e, chainps.TimeoutError) and e.code == chainps.CPS_ETIMEDOUT
    assert (f"the job did not start within 1.5 s (scheduler 127.0.0.1:{port} unreachable"
            in str(e)), str(e)


def test_error_says_the_scheduler_port_is_out_of_range(monkeypatch):
    e = _init_fails(monkeypatch, CHAINPS_SCHEDULER="127.0.0.1:99999",
                    CHAINPS_SECRET_FILE=tj.secret_file())
    assert e.code == chainps.CPS_ECONFIG
    assert "CHAINPS_SCHEDULER: 99999 is out of range 1..65535" in str(e)


def test_error_says_the_workers_port_is_taken(monkeypatch):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        e = _init_fails(monkeypatch, CHAINPS_SCHEDULER="127.0.0.1:9", CHAINPS_BIND="127.0.0.1",
                        CHAINPS_PORT=port, CHAINPS_SECRET_FILE=tj.secret_file())
    assert e.code == chainps.CPS_ETRANSPORT
    assert f"nn_bind tcp://127.0.0.1:{port}: Address already in use" in str(e)


def test_a_refused_call_on_a_live_client_says_why(client):
    client.declare("why", 4, optim=SGD)
    with pytest.raises(chainps.Error) as e:
        client.declare("why", 5, optim=SGD)
    assert e.value.code == chainps.CPS_EEXIST
    assert str(e.value) == ("declare(why): already exists with a different definition "
                            "(CPS_EEXIST): tensor why declared again with another definition "
                            "(shape 5, was 4)")
    # The next call that fails says its own reason, not the last one's.
    with pytest.raises(chainps.Error) as e:
        client.declare("why_badlr", 4, optim=chainps.SGD(-1.0))
    assert "why_badlr" in e.value.reason and "declared again" not in str(e.value), str(e.value)
    # A call that succeeds in between leaves nothing behind for the next one.
    client.declare("why", 4, optim=SGD)


def test_a_failed_asynchronous_push_says_why_at_wait(tmp_path):
    """The reason travels with the operation: Handle.wait() raises with the line the library
    logged as it gave the push up (here its only server was killed)."""
    c = tj.Cluster(str(tmp_path), servers=1, workers=1, mode="async")
    code = ("import chainps, numpy as np, os, signal\n"
            "c = chainps.init(); t = c.declare('w', 4)\n"
            "os.kill(int(os.environ['SERVER_PID']), signal.SIGKILL)\n"
            "h = c.push_async(t, np.ones(4, np.float32))\n"
            "try:\n    h.wait(timeout=30)\n    print('no error')\n"
            "except chainps.Error as e:\n    print('error:', e.name, '|', e.reason, flush=True)\n"
            "os._exit(0)\n")
    # The server is one of the cluster's processes: ended by its PID with the rest at close.
    r = _worker_script(c, code, SERVER_PID=c.procs[1].pid, CHAINPS_UNAVAILABLE_TIMEOUT_MS=2000,
                       CHAINPS_REQUEST_TIMEOUT_MS=300)
    assert r.returncode == 0, r.stderr
    assert ("error: CPS_EUNAVAILABLE | range 0 unavailable for 2000 ms: failing the request"
            in r.stdout), r.stdout + r.stderr


def test_job_ended_ends_a_script_cleanly_and_can_be_caught():
    """chainps.JobEnded (a replacement started after the others finished the job) ends an
    uncaught script with status 0, saying nothing on stderr, and is caught by name."""
    env = tj.env()
    r = subprocess.run([sys.executable, "-c", "import chainps\nraise chainps.JobEnded('over')\n"
                        "print('not reached')"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r
    r = subprocess.run([sys.executable, "-c", "import chainps\ntry:\n"
                        "    raise chainps.JobEnded('over')\nexcept chainps.JobEnded as e:\n"
                        "    print('caught:', e, e.code)\n"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "caught: over 0\n", r
