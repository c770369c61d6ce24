#!/usr/bin/env bash
# Prometheus metrics and the last checkpoint (issue 15): a small sync job under
# `chainps launch --metrics-port BASE`; /metrics of the scheduler and of server 0 scraped twice
# while it trains: every line in the text format (0.0.4), a TYPE before each family's samples,
# push counters and bytes move; 404 on another path, 405 on POST, 400 on a malformed request,
# after which the endpoint still serves. Then `chainps checkpoint export` and `status --json`
# (and the text status, and the scheduler's /metrics) show it as the last checkpoint.
# Loopback only; the job is ended by launch's PID. usage: metrics.sh CHAINPS LSQ_WORKER
set -euo pipefail
cps=$1
lsq=$2
# shellcheck source=launch_job.sh
. "$(dirname "$0")/launch_job.sh"
fail() { echo "FAIL: $*"; tail -30 "$dir/launch.log" 2>/dev/null || true; exit 1; }

# Three consecutive free loopback ports: the scheduler's and the two servers' metrics.
base=$("$py" - <<'PY'
import socket
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p > 65000:
        continue
    try:
        held = []
        for q in (p, p + 1, p + 2):
            t = socket.socket(); t.bind(("127.0.0.1", q)); held.append(t)
        for t in held: t.close()
        print(p); break
    except OSError:
        for t in held: t.close()
PY
)
[ -n "$base" ] || fail "no three free ports"

# Bad values are refused before anything starts.
set +e
"$cps" server --insecure --metrics-port 70000 >"$dir/bad.out" 2>&1; rc=$?
set -e
[ "$rc" = 2 ] || fail "--metrics-port 70000 exited $rc, not 2"

"$cps" secret "$dir/job.key" >/dev/null
# 1 ms a step: this test is about the metrics (an unpaced job's export: ckpt_fast.sh).
"$cps" launch --secret-file "$dir/job.key" --servers 2 --workers 2 --mode sync --timeout 120 \
    --metrics-port "$base" -- "$lsq" --steps 10000000 --step-ms 1 >"$dir/launch.log" 2>&1 &
launch_pid=$!
addr=$(scheduler_addr "$dir/launch.log")
[ -n "$addr" ] || fail "launch did not say where its scheduler is"
grep -q "^launch: metrics at http://127.0.0.1:$base/metrics" "$dir/launch.log" ||
    fail "launch did not print the metrics ports"

"$py" - "$base" <<'PY' || fail "metrics"
import re, socket, sys, time, urllib.error, urllib.request
base = int(sys.argv[1])
sched, server0 = f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf'^({NAME})(\{{{NAME}="(?:[^"\\]|\\.)*"(?:,{NAME}="(?:[^"\\]|\\.)*")*\}})? '
                    r'([-+]?(?:[0-9.]+(?:e[-+]?[0-9]+)?|Inf)|NaN)$')

def scrape(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        assert r.status == 200, r.status
        ctype = r.headers["Content-Type"]
        assert ctype.startswith("text/plain; version=0.0.4"), ctype
        text = r.read().decode()
    assert text.endswith("\n"), "the page does not end with a newline"
    types, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            assert name not in types, f"two TYPE lines for {name}"
            types[name] = kind
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name = m.group(1)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert family in types, f"sample {name} before its TYPE line"
        values[name + (m.group(2) or "")] = float(m.group(3))
    return types, values

def wait_for(url, key, limit=30):
    end = time.time() + limit
    while time.time() < end:
        try:
            _, v = scrape(url)
            if v.get(key, 0) > 0:
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url}: {key} never above 0")

wait_for(server0, 'chainps_server_pushes_total{rank="0"}')
wait_for(sched, "chainps_job_push_bytes_total")
t1, s1 = scrape(server0)
_, c1 = scrape(sched)
time.sleep(1.0)
t2, s2 = scrape(server0)
_, c2 = scrape(sched)
r = '{rank="0"}'
for k in ("chainps_server_pushes_total", "chainps_server_push_bytes_total",
          "chainps_server_updates_applied_total", "chainps_server_apply_latency_seconds_count"):
    assert s2[k + r] > s1[k + r], f"{k} did not move: {s1[k + r]} -> {s2[k + r]}"
assert t1["chainps_server_pushes_total"] == "counter"
assert t1["chainps_server_apply_latency_seconds"] == "histogram"
assert s2['chainps_server_apply_latency_seconds_bucket{rank="0",le="+Inf"}'] == \
    s2["chainps_server_apply_latency_seconds_count" + r]
assert s2["chainps_view_epoch" + r] >= 1
for k in ("chainps_job_push_bytes_total", "chainps_job_updates_applied_total", "chainps_job_step"):
    assert c2[k] > c1[k], f"scheduler {k} did not move: {c1[k]} -> {c2[k]}"
assert c2["chainps_view_epoch"] >= 1 and c2["chainps_live_servers"] == 2, c2
assert c2["chainps_live_workers"] == 2 and c2['chainps_declared_deaths_total{role="server"}'] == 0
assert c2['chainps_range_replicas{range="0"}'] == 2, c2

def status_of(url, method="GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, data=b"x" if method == "POST" else None), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
assert status_of(server0 + "/") == 404 and status_of(sched + "/metricsx") == 404
assert status_of(sched + "/metrics", "POST") == 405

def raw(data):
    with socket.create_connection(("127.0.0.1", base), timeout=5) as s:
        s.sendall(data)
        return s.recv(200).decode(errors="replace")
for bad, code in ((b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n", 400),  # header without ':'
                  (b"GET /metrics\r\n\r\n", 400),  # no HTTP version
                  (b"GET /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: zz\r\n\r\n", 400),
                  (b"GET /metrics HTTP/9.9\r\nHost: a\r\n\r\n", 505),
                  (b"BREW /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 405)):
    head = raw(bad)
    assert head.startswith(f"HTTP/1.1 {code} "), f"{bad!r} answered {head[:40]!r}, not {code}"
# Not even a request line: the connection is closed unanswered.
assert raw(b"GARBAGE\r\n\r\n") == ""
_, c3 = scrape(sched)  # still serving
assert c3["chainps_job_push_bytes_total"] >= c2["chainps_job_push_bytes_total"]
print(f"metrics: server 0 pushes {s1['chainps_server_pushes_total' + r]:.0f} -> "
      f"{s2['chainps_server_pushes_total' + r]:.0f}, job step {c1['chainps_job_step']:.0f} -> "
      f"{c2['chainps_job_step']:.0f}; 404, 405, 400, 505 answered, still serving")
PY

# The last checkpoint: none yet, then the one just exported.
st() { "$cps" status --secret-file "$dir/job.key" --scheduler "$addr" "$@"; }
st --json >"$dir/before.json"
"$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["last_checkpoint"] is None, d["last_checkpoint"]' \
    "$dir/before.json" || fail "a last checkpoint before any was taken"
st | grep -q "^last checkpoint: none" || fail "text status without 'last checkpoint: none'"
"$cps" checkpoint export --secret-file "$dir/job.key" --scheduler "$addr" --out "$dir/ckpt" \
    >"$dir/export.log" 2>&1 || { cat "$dir/export.log"; fail "checkpoint export"; }
ok=
for _ in $(seq 30); do
    st --json >"$dir/after.json"
    if "$py" - "$dir/after.json" "$dir/ckpt" <<'PY'
import json, os, sys, time
c = json.load(open(sys.argv[1]))["last_checkpoint"]
if c is None:
    sys.exit(1)
assert c["id"] == 1 and c["step"] > 0, c
assert os.path.realpath(c["path"]).startswith(os.path.realpath(sys.argv[2])), c
assert os.path.exists(c["path"]), c
assert 0 <= c["age_s"] < 60 and abs(c["unix_ms"] / 1000 - time.time()) < 60, c
print(f"status --json: last checkpoint {c}")
PY
    then ok=1; break; fi
    sleep 0.2
done
[ -n "$ok" ] || { cat "$dir/after.json"; fail "status --json does not show the checkpoint"; }
st | grep -q "^last checkpoint: #1 at step " || fail "text status without the checkpoint"
"$py" - "$base" <<'PY' || fail "checkpoint metrics"
import sys, time, urllib.request
for _ in range(20):  # the page is rendered every 250 ms
    text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read()
    lines = dict(l.rsplit(" ", 1) for l in text.decode().splitlines() if not l.startswith("#"))
    if "chainps_checkpoint_last_id" in lines:
        break
    time.sleep(0.2)
assert lines["chainps_checkpoint_last_id"] == "1" and lines["chainps_checkpoints_total"] == "1"
assert float(lines["chainps_checkpoint_age_seconds"]) >= 0
assert int(lines["chainps_checkpoint_last_step"]) > 0
PY

stop_launch || fail "launch did not stop"
echo "PASS"
