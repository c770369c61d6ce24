#!/usr/bin/python3
"""Run every command the documentation shows (ctest docs.snippets, issue 27).

Extracts the fenced ```sh, ```bash and ```python blocks of README.md, docs/*.md,
examples/*/README.md, python/README.md and deploy/*/README.md and runs each:

- The blocks of one file run in document order in one fresh directory that stands for the
  repository's root: every top-level entry of the repository is symlinked there, and
  build/release points at the build under test. What a block writes stays there for the file's
  later blocks; HOME and TMPDIR are inside it. It is removed at the end (KEEP=1 keeps it).
- sh/bash blocks run with `bash -euo pipefail`; python blocks with /usr/bin/python3 and
  PYTHONPATH=build/release/python. No CHAINPS_*, DMLC_* or MS_* variable comes in from outside.
- Each block runs in a process group of its own, in a user, network and PID namespace of its
  own where the kernel allows it (`unshare`; loopback only, so fixed ports cannot collide with
  other jobs on the machine, and every process the block leaves behind dies with it). When the
  block ends or its time is up, its process group is sent SIGTERM, then SIGKILL, by its PID.
- A mark right before a block (several marks may follow each other):
    <!-- doc-test: skip: REASON -->      not run; every skip is printed with its reason
    <!-- doc-test: file: NAME -->        the block is written to NAME (a program a later block
                                          builds or runs) instead of being run
    <!-- doc-test: timeout: SECONDS -->  instead of the default (120 s)
  A mark that precedes no block, or an unknown mark, is an error.

usage: run_snippets.py --build DIR [--root DIR] [--list] [--only REGEX]
Exit status: 0 when every block that runs succeeds, 1 otherwise, 2 on bad usage or marks.
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RUN_LANGS = {"sh": "sh", "bash": "sh", "python": "python"}
MARK = re.compile(r"^<!--\s*doc-test:\s*(\w+)\s*:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
DEFAULT_TIMEOUT = 120
PYTHON = "/usr/bin/python3"


class Block:
    def __init__(self, path, line, lang, text, marks):
        self.path, self.line, self.lang, self.text, self.marks = path, line, lang, text, marks

    def where(self):
        return f"{self.path}:{self.line}"


def doc_files(root):
    pats = ["README.md", "docs/*.md", "examples/*/README.md", "python/README.md",
            "deploy/*/README.md"]
    out = []
    for p in pats:
        out += sorted(glob.glob(os.path.join(root, p)))
    return [os.path.relpath(p, root) for p in out]


def parse(root, rel):
    """The blocks of one file, with their marks; raises ValueError on a stray or unknown mark."""
    blocks, marks, mark_line = [], {}, 0
    lines = open(os.path.join(root, rel), encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARK.match(line)
        if m:
            kind, value = m.group(1), m.group(2)
            if kind not in ("skip", "file", "timeout"):
                raise ValueError(f"{rel}:{i + 1}: unknown doc-test mark '{kind}'")
            if kind == "timeout" and not value.isdigit():
                raise ValueError(f"{rel}:{i + 1}: timeout needs seconds, not '{value}'")
            if not marks:
                mark_line = i + 1
            marks[kind] = value
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            lang = f.group(1)
            start = i + 1
            j = start
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            if j == len(lines):
                raise ValueError(f"{rel}:{i + 1}: a block that never closes")
            blocks.append(Block(rel, i + 1, lang, "\n".join(lines[start:j]) + "\n", marks))
            marks = {}
            i = j + 1
            continue
        if marks:
            raise ValueError(f"{rel}:{mark_line}: a doc-test mark not right before a block")
        i += 1
    if marks:
        raise ValueError(f"{rel}:{mark_line}: a doc-test mark not right before a block")
    return blocks


def probe_unshare():
    """Whether this kernel lets us make a user+net+pid namespace with loopback up."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    try:
        r = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork",
                            "--kill-child", "--", "ip", "link", "set", "lo", "up"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def make_scratch(root, build, base):
    d = tempfile.mkdtemp(prefix="doc-", dir=base)
    for name in os.listdir(root):
        if name in (".git", "build"):
            continue
        os.symlink(os.path.join(root, name), os.path.join(d, name))
    os.makedirs(os.path.join(d, "build"))
    os.symlink(build, os.path.join(d, "build", "release"))
    os.makedirs(os.path.join(d, "tmp"))
    return d


def block_env(scratch, lang):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHAINPS_", "DMLC_", "MS_", "PS_", "PYTHON"))}
    env.update(HOME=scratch, TMPDIR=os.path.join(scratch, "tmp"), PYTHONDONTWRITEBYTECODE="1")
    if lang == "python":
        env["PYTHONPATH"] = os.path.join(scratch, "build", "release", "python")
    return env


def end_group(pgid):
    """SIGTERM the block's process group, then SIGKILL what is left after 2 s."""
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def run_block(b, n, scratch, use_ns):
    kind = RUN_LANGS[b.lang]
    script = os.path.join(scratch, "tmp", f"block-{n}.{'sh' if kind == 'sh' else 'py'}")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(b.text)
    cmd = ["bash", "-euo", "pipefail", script] if kind == "sh" else [PYTHON, script]
    if use_ns:
        cmd = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child",
               "--", "bash", "-c", 'ip link set lo up && exec "$@"', "doc-test"] + cmd
    timeout = int(b.marks.get("timeout", DEFAULT_TIMEOUT))
    log = os.path.join(scratch, "tmp", f"block-{n}.log")
    t0 = time.monotonic()
    with open(log, "w+b") as out:
        p = subprocess.Popen(cmd, cwd=scratch, env=block_env(scratch, b.lang), stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
            why = None if rc == 0 else f"exit status {rc}"
        except subprocess.TimeoutExpired:
            why = f"still running after {timeout} s"
        finally:
            end_group(p.pid)
            p.wait()
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    return why, time.monotonic() - t0, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build directory under test")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), help="the repository (default: this script's)")
    ap.add_argument("--list", action="store_true", help="print the blocks and marks, run nothing")
    ap.add_argument("--only", help="run only the blocks whose file:line matches this regex")
    a = ap.parse_args()
    root, build = os.path.abspath(a.root), os.path.abspath(a.build)
    if not a.list and not os.path.exists(os.path.join(build, "chainps")):
        print(f"run_snippets: {build}/chainps is not built", file=sys.stderr)
        return 2
    files = doc_files(root)
    try:
        parsed = [(rel, parse(root, rel)) for rel in files]
    except ValueError as e:
        print(f"run_snippets: {e}", file=sys.stderr)
        return 2
    use_ns = False if a.list else probe_unshare()
    if not a.list:
        print("run_snippets: each block in its own user/net/pid namespace" if use_ns else
              "run_snippets: no namespaces here (unshare refused): blocks share the host's loopback")
    ran = skipped = failed = written = 0
    t_all = time.monotonic()
    base = tempfile.mkdtemp(prefix="chainps-docs-", dir=os.environ.get("TMPDIR"))
    try:
        for rel, blocks in parsed:
            scratch = None
            for n, b in enumerate(blocks):
                if a.only and not re.search(a.only, b.where()):
                    continue
                if "skip" in b.marks:
                    if b.lang in RUN_LANGS or "file" in b.marks:
                        skipped += 1
                        print(f"SKIP {b.where()} {b.lang}: {b.marks['skip']}")
                    continue
                if "file" not in b.marks and b.lang not in RUN_LANGS:
                    continue
                if a.list:
                    what = f"file {b.marks['file']}" if "file" in b.marks else "run"
                    print(f"{what:<14} {b.where()} {b.lang}")
                    continue
                if scratch is None:
                    scratch = make_scratch(root, build, base)
                if "file" in b.marks:
                    with open(os.path.join(scratch, b.marks["file"]), "w", encoding="utf-8") as fh:
                        fh.write(b.text)
                    written += 1
                    print(f"file {b.where()} {b.lang} -> {b.marks['file']}")
                    continue
                why, secs, text = run_block(b, n, scratch, use_ns)
                ran += 1
                if why is None:
                    print(f"ok   {b.where()} {b.lang} ({secs:.1f} s)")
                else:
                    failed += 1
                    print(f"FAIL {b.where()} {b.lang} ({secs:.1f} s): {why}")
                    print("---- the block:\n" + b.text + "---- its output (last 60 lines):")
                    print("\n".join(text.rstrip("\n").split("\n")[-60:]))
                    print("----")
                sys.stdout.flush()
    finally:
        if os.environ.get("KEEP") == "1":
            print(f"run_snippets: kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(f"run_snippets: {ran} run, {failed} failed, {skipped} skipped, {written} written as "
          f"files, {time.monotonic() - t_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
