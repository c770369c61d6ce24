#!/usr/bin/python3
"""The verdict and summary of tests/integration/soak.sh, from its work directory.

Reads each phase's chaos log (events, verdict, WARN lines), exports.txt, samples.csv and
pyload.txt; prints the summary; exits 1 if any check failed, printing why.

Resource bounds (per hour, least-squares slope over a process's samples after WARMUP_S):
  SLOPE_RSS_MB_H (64): a leak of 200 bytes per step (fmnist runs ~50 sync steps/s here, so
    ~36 MB/h) or of one 256 KiB push buffer a minute is caught, while a process's
    steady-state churn (LMDB pages touched by reads, malloc arenas settling) stays well below:
    the clean runs measured a few MB/h at most.
  SLOPE_FDS_H (30): a socket or file leaked per fault (a fault every ~10 s is 360/h) or per
    export (60/h) is caught; peers reconnecting after a fault move the count by a few for
    seconds, which the fit over minutes absorbs.
Disk is not judged by a slope but by a cap, DISK_CAP_MB (1024) on each data directory's
  largest size (server-R, scheduler); the slopes of the sum (raw, and of each directory's
  high-water) are printed. A server's data.mdb is allocated as large as its LMDB map
  (posix_fallocate), which doubles (64 MB .. 512 MB here) while a snapshot (export, state
  transfer) keeps freed pages from reuse, and is made afresh when a drained server comes back:
  the size moves in steps of hundreds of MB both ways, so a least-squares slope over minutes
  says where a step fell, not whether disk use grows (the 16-minute run's 2,800 MB/h came from
  two maps reaching 512 MB, the design's level). The store keeps its map 8 times the pages in
  use; each server holds ~1.4 MB of this model's values and momentum, so a map past 1 GB means
  more than 128 MB pinned (a snapshot holding ~90 step-rewrites, or a read transaction left
  open, which pins ~250 GB/h here): a leak, or a snapshot slow enough to look at.
A series shorter than MIN_SPAN_S (300) after its warm-up is listed, not judged: a slope over
a few minutes says more about start-up than about leaks.
"""
import collections
import os
import re
import sys

work = sys.argv[1]
env = os.environ.get
BOUND = {"rss": float(env("SLOPE_RSS_MB_H", "64")), "fds": float(env("SLOPE_FDS_H", "30")),
         "disk": 0.0}  # not judged by slope: see DISK_CAP_MB
DISK_CAP_MB = float(env("DISK_CAP_MB", "1024"))
UNIT = {"rss": "MB/h", "fds": "fds/h", "disk": "MB/h"}
WARMUP_S = float(env("WARMUP_S", "120"))
MIN_SPAN_S = float(env("MIN_SPAN_S", "300"))
failures = []

# Every WARN line the soak may see, with the faults that explain it: the line is explained only
# if its phase injected at least one of them. "end" is the job's end itself (chaos stops the
# servers by SIGTERM, which asks the finished job for a drain).
ALLOW = [
    (r"scheduler: server \d+ \(rank \d+\) silent for \d+ ms: declared dead", "server declared dead",
     {"server kill", "pause", "scheduler kill"}),
    (r"scheduler: worker \d+ \(rank \d+\) silent for \d+ ms: declared dead", "worker declared dead",
     {"worker kill", "scheduler kill"}),
    (r"transport: peer \d+ \(\S+\): dropping \d+ queued messages", "queue to a dead peer dropped",
     {"server kill", "pause", "drain", "worker kill", "scheduler kill", "end"}),
    (r"sync step \d+ has waited \d+ s for worker rank\(s\)", "sync step waited for a worker",
     {"worker kill", "pause", "server kill", "scheduler kill"}),
    (r"scheduler: drain refused: the job is not running", "drain after the job's end", {"end"}),
    (r"server: did not run for \d+ ms \(more than the \d+ ms failure timeout\)",
     "server woke from a pause", {"pause"}),
    (r"server: declared dead by the scheduler \(view epoch \d+\): fenced",
     "paused server fenced", {"pause"}),
    (r"left our probe unanswered for \d+ ms after node \d+ reported", "probe unanswered",
     {"pause"}),
    (r"scheduler: range \d+: server \d+ had not caught up with server \d+; it leaves the chain",
     "joiner left behind by a failure", {"server kill", "pause", "drain", "scheduler kill"}),
    (r"server: closed \d+ checkpoint read view\(s\): the store had to grow while they were open",
     "export cut outlived the store's room (retried)",
     {"server kill", "pause", "drain", "worker kill", "scheduler kill"}),
    # ERROR lines are classified too: a join whose source failed over is retried.
    (r"server: range \d+: joining failed \(the source left the range's chain: stale view epoch\)",
     "join retried after its source left", {"server kill", "pause", "drain", "scheduler kill"}),
]


def kind_of(ev):
    """The fault an event line injects, or None."""
    if re.match(r"SIGKILL scheduler", ev):
        return "scheduler kill"
    if re.match(r"SIGKILL server", ev):
        return "server kill"
    if re.match(r"SIGKILL worker", ev):
        return "worker kill"
    if re.match(r"SIGSTOP server", ev):
        return "pause"
    if re.match(r"drain server \d+ \(pid \d+\)$", ev):
        return "drain"
    return None


def faults(phase, log):
    """Injected faults by kind, and how many were cured (the cure seen after the fault)."""
    events = [m.group(1) for m in re.finditer(r"^chaos: \+[\d.]+ s (.*)$", log, re.M)]
    injected, cured = collections.Counter(), collections.Counter()
    joins = refused = self_exits = 0
    drained = set()
    pending = []  # (kind, cure regex)
    for ev in events:
        k = kind_of(ev)
        if k:
            tag = re.match(r"\S+ (scheduler|server \d+|worker \d+)", ev).group(1)
            injected[k] += 1
            cure = {"scheduler kill": rf"restarted {tag} ", "server kill": rf"restarted {tag} ",
                    "pause": rf"SIGCONT {tag} ",
                    "drain": rf"{tag} drained and exited \(exit status 0\)",
                    "worker kill": rf"replacement {tag} \(pid \d+\) started"}[k]
            pending.append((k, cure))
            continue
        if re.match(r"drain .*: refused", ev):
            refused += 1
        if re.match(r"\S+ \d+ exited by itself", ev):
            self_exits += 1  # e.g. a paused server fenced on waking: chaos restarts it
        m = re.match(r"(server \d+) drained and exited", ev)
        if m:
            drained.add(m.group(1))
        m = re.match(r"restarted (server \d+) ", ev)
        if m and m.group(1) in drained:
            drained.discard(m.group(1))
            joins += 1  # a drained server back as a new member
        for i, (k, cure) in enumerate(pending):
            if re.match(cure, ev):
                cured[k] += 1
                del pending[i]
                break
    for k, _ in pending:
        failures.append(f"{phase}: a {k} was never cured (no restart/continue/exit seen)")
    return injected, cured, joins, refused, self_exits


def slope(points):
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if den == 0 else sum((t - mt) * (v - mv) for t, v in points) / den * 3600


phases = []
with open(os.path.join(work, "phases.txt")) as f:
    for line in f:
        name, rc, secs = line.split()
        phases.append((name, int(rc), int(secs)))

print("soak: ===== summary =====")
total_inj, total_cured = collections.Counter(), collections.Counter()
warn_classes = collections.Counter()
for name, rc, secs in phases:
    log = open(os.path.join(work, name, "chaos.log"), errors="replace").read()
    inj, cured, joins, refused, self_exits = faults(name, log)
    total_inj.update(inj)
    verdict = re.search(r"^chaos: (PASS|FAIL).*$", log, re.M)
    ok = rc == 0 and verdict and verdict.group(1) == "PASS"
    survived = ok and re.search(r"^chaos: job finished without a restart: yes", log, re.M)
    if survived:
        total_cured.update(cured)
    print(f"soak: phase {name}: {secs} s, chaos exit {rc}: "
          f"{verdict.group(0) if verdict else 'no verdict'}")
    print(f"soak:   faults: " + ", ".join(f"{k} {inj[k]} (cured {cured[k]})" for k in sorted(inj))
          + f"; joins after drains {joins}; drains refused {refused}; "
          f"servers that left by themselves and were restarted {self_exits}")
    if not ok:
        failures.append(f"phase {name}: chaos did not pass (exit {rc})")
    if name == "bitwise" and not re.search(r"identical to the fault-free run: yes", log):
        failures.append("phase bitwise: final parameters not compared equal to the fault-free run")
    kinds = set(inj) | {"end"}
    for line in re.findall(r"^.* (?:WARN|ERROR) .*$", log, re.M):
        for pat, cls, why in ALLOW:
            if re.search(pat, line):
                if kinds & why:
                    warn_classes[cls] += 1
                    break
                failures.append(f"{name}: WARN of class '{cls}' with none of its faults "
                                f"({', '.join(sorted(why))}) injected: {line}")
                break
        else:
            warn_classes["UNEXPLAINED"] += 1
            failures.append(f"{name}: unexplained {'ERROR' if ' ERROR ' in line else 'WARN'}: "
                            f"{line}")

print("soak: faults injected/survived by kind: " + ", ".join(
    f"{k} {total_inj[k]}/{total_cured[k]}" for k in sorted(total_inj)))

# Exports.
ex = collections.Counter()
ex_path = os.path.join(work, "exports.txt")
for line in open(ex_path) if os.path.exists(ex_path) else []:
    phase, n, status, attempts, secs, inspect = line.split()
    ex[status] += 1
    if status == "taken":
        ex["retried"] += int(attempts) > 1
        ex["verified"] += inspect == "0"
        if inspect != "0":
            failures.append(f"{phase}: export {n} does not verify (checkpoint inspect {inspect})")
    elif status == "FAILED":
        failures.append(f"{phase}: export {n} failed 3 attempts (see {phase}/export.log)")
print(f"soak: exports: {ex['taken']} taken ({ex['retried']} after a retry), {ex['verified']} "
      f"verified by checkpoint inspect, {ex['FAILED']} failed, {ex['ended']} cut short by the job's end")
if ex["taken"] == 0:
    failures.append("no export was taken")
py_path = os.path.join(work, "pyload.txt")
for line in open(py_path) if os.path.exists(py_path) else []:
    phase, rc, rest = line.split(" ", 2)
    print(f"soak:   [{phase}] {rest.strip()}")
    if rc != "0":
        failures.append(f"{phase}: the last export did not load in Python: {rest.strip()}")

# Resources.
series = collections.defaultdict(list)
by_dir = collections.defaultdict(dict)  # (phase, t) -> {dir: MB}
s_path = os.path.join(work, "samples.csv")
for line in open(s_path) if os.path.exists(s_path) else []:
    phase, t, role, rank, pid, rss, fds, disk = line.strip().split(",")
    t = float(t)
    if role == "disk":
        if disk:
            by_dir[(phase, t)][rank] = int(disk) / 1024
    else:
        series[(phase, role, rank, pid, "rss")].append((t, int(rss) / 1024))
        series[(phase, role, rank, pid, "fds")].append((t, int(fds)))
high = collections.defaultdict(dict)
for (phase, t), dirs in sorted(by_dir.items()):
    for d, mb in dirs.items():
        high[phase][d] = max(high[phase].get(d, 0), mb)
    series[(phase, "disk", "data", "-", "disk_raw")].append((t, sum(dirs.values())))
    series[(phase, "disk", "data", "-", "disk")].append((t, sum(high[phase].values())))
UNIT["disk_raw"] = "MB/h"

print(f"soak: resource slopes (least squares after a {WARMUP_S:.0f} s warm-up; judged when the "
      f"series spans >= {MIN_SPAN_S:.0f} s; bounds rss (anonymous) {BOUND['rss']} MB/h, fds {BOUND['fds']}/h, "
      f"disk: each data dir at most {DISK_CAP_MB:.0f} MB):")
for phase in sorted(high):
    print(f"soak:   [{phase}] data dirs' largest size: " + ", ".join(
        f"{d} {mb:.0f} MB" for d, mb in sorted(high[phase].items())))
    for d, mb in sorted(high[phase].items()):
        if mb > DISK_CAP_MB:
            failures.append(f"{phase}: data dir {d} reached {mb:.0f} MB, above {DISK_CAP_MB:.0f}")
worst = {}
judged = 0
for key in sorted(series):
    phase, role, rank, pid, what = key
    pts = series[key]
    pts = [p for p in pts if p[0] >= pts[0][0] + WARMUP_S]
    if len(pts) < 3:
        continue
    span = pts[-1][0] - pts[0][0]
    sl = slope(pts)
    judge = span >= MIN_SPAN_S and len(pts) >= 10 and not what.startswith("disk")
    who = {"disk": "data dirs, high-water", "disk_raw": "data dirs, size"}.get(
        what, f"{role} {rank} pid {pid}")
    if judge:
        judged += 1
        worst[(role, what)] = max(worst.get((role, what), -1e18), sl)
        if sl > BOUND[what]:
            failures.append(f"{phase}: {who}: {what} slope {sl:+.1f} {UNIT[what]} above "
                            f"{BOUND[what]} ({pts[0][1]:.1f} -> {pts[-1][1]:.1f} in {span:.0f} s)")
    if judge or what.startswith("disk") or span >= 60:
        print(f"soak:   [{phase}] {who:26} {what:8} {sl:+9.2f} {UNIT[what]:6} over {span:5.0f} s "
              f"({pts[0][1]:.1f} -> {pts[-1][1]:.1f})"
              f"{'' if judge else '  (reported)' if what.startswith('disk') else '  (not judged: short)'}")
print("soak: worst judged slopes: " + (", ".join(
    f"{r} {w} {v:+.2f} {UNIT[w]}" for (r, w), v in sorted(worst.items())) or "none (run too short)"))

print("soak: WARN and ERROR lines by class: " + (", ".join(
    f"{c} {n}" for c, n in warn_classes.most_common()) or "none"))
if failures:
    for f in failures:
        print(f"soak: FAIL {f}")
    sys.exit(1)
print(f"soak: PASS ({len(phases)} phases, {sum(total_inj.values())} faults survived, "
      f"{ex['verified']} exports verified, {judged} resource series judged)")
