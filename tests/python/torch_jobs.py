"""Start chainps jobs for the torch tests: `chainps launch` runs, or a hand-started cluster that
stays up after its workers (for a checkpoint export of the final model). Every process is
started with a deadline and ended by its PID; everything listens on 127.0.0.1."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(ROOT, "examples", "torch", "train.py")
PYTHON = "/usr/bin/python3"


def cli():
    path = os.environ.get("CHAINPS_CLI")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("set CHAINPS_CLI to the chainps command (ctest does)")
    return path


_secret = None


def secret_file():
    """This test process's job secret (made once by `chainps secret`, removed at exit)."""
    global _secret
    if _secret is None:
        import atexit
        import shutil
        import tempfile
        d = tempfile.mkdtemp(prefix="chainps-py-secret-")
        atexit.register(shutil.rmtree, d, True)
        path = os.path.join(d, "job.secret")
        subprocess.run([cli(), "secret", path], check=True, stdout=subprocess.DEVNULL,
                       timeout=30)
        _secret = path
    return _secret


def env(**extra):
    """The environment for a job's process: ours without any job variables, the job's secret,
    and `extra`."""
    e = dict(os.environ)
    for k in list(e):
        if k.startswith(("CHAINPS_", "DMLC_", "MS_")) and k != "CHAINPS_CLI":
            del e[k]
    if "CHAINPS_INSECURE" not in extra:
        e["CHAINPS_SECRET_FILE"] = secret_file()
    e.update({k: str(v) for k, v in extra.items()})
    return e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_all(procs):
    """End every process of `procs` still running, by its PID, and reap it."""
    for p in procs:
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def finals(text):
    """The `final:` lines of a job's output: [(accuracy, samples/s, checksum)]."""
    pat = r"final: test accuracy ([0-9.]+)%, ([0-9.]+) samples/s, steps \d+, checksum ([0-9a-f]+)"
    return [(float(a), float(r), c) for a, r, c in re.findall(pat, text)]


def launch(args, train_args, timeout=240):
    """Run `chainps launch ARGS -- python3 train.py TRAIN_ARGS`; returns (exit code, output)."""
    cmd = [cli(), "launch", "--timeout", str(timeout - 20), *args, "--", PYTHON, TRAIN,
           *train_args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env(), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"launch did not end in {timeout} s:\n{out[-4000:]}")
    return p.returncode, out


class Cluster:
    """A scheduler (--hold) and S servers started by hand, for workers started by the test."""

    def __init__(self, tmp, servers, workers, mode="sync", replicas=None):
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.procs = []
        self.logs = []
        self.tmp = tmp
        args = [cli(), "scheduler", "--servers", str(servers), "--workers", str(workers),
                "--port", str(self.port), "--bind", "127.0.0.1", "--mode", mode, "--hold",
                "--data", os.path.join(tmp, "sched")]
        if replicas:
            args += ["--replicas", str(replicas)]
        self._start("scheduler", args)
        for i in range(servers):
            self._start(f"server{i}", [cli(), "server", "--scheduler", self.addr,
                                       "--data", os.path.join(tmp, f"server{i}")])

    def _start(self, name, args, extra_env=None):
        log = open(os.path.join(self.tmp, f"{name}.log"), "w+")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                             env=env(**(extra_env or {})), start_new_session=True)
        self.procs.append(p)
        self.logs.append(log)
        return p

    def worker(self, rank, train_args):
        return self._start(f"worker{rank}", [PYTHON, TRAIN, *train_args],
                           {"CHAINPS_ROLE": "worker", "CHAINPS_SCHEDULER": self.addr,
                            "CHAINPS_RANK": rank})

    def output(self, name):
        with open(os.path.join(self.tmp, f"{name}.log")) as f:
            return f.read()

    def run(self, *args, timeout=60):
        return subprocess.run([cli(), *args], capture_output=True, text=True, timeout=timeout,
                              env=env())

    def close(self):
        self.run("status", "--scheduler", self.addr, "--end")
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        kill_all(self.procs)
        for log in self.logs:
            log.close()


def wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def worker_pid(parent, rank):
    """The pid of `parent`'s child whose environment has CHAINPS_RANK=rank, or None."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                if f"CHAINPS_RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(d)
        except (OSError, ValueError, IndexError):
            continue
    return None


def launch_killing_worker(cmd, log_path, when, rank=1, timeout=240):
    """Run `cmd` (a `chainps launch ... --restart-workers` line) logging to log_path; once the
    log shows `when` (or after 120 s), SIGKILL the worker of `rank`. Returns (exit code, log)."""
    log = open(log_path, "w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env(),
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            log.seek(0)
            if when in log.read():
                break
            time.sleep(0.2)
        victim = worker_pid(p.pid, rank)
        assert victim, f"no worker of rank {rank} to kill"
        os.kill(victim, signal.SIGKILL)
        p.wait(timeout=timeout)
    finally:
        kill_all([p])
    log.seek(0)
    return p.returncode, log.read()


if __name__ == "__main__":
    sys.exit("a helper module of tests/python/test_torch.py")
