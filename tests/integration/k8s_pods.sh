#!/usr/bin/env bash
# ctest integration.k8s_pods: the pods of deploy/k8s/ run as their manifests say, without
# Kubernetes. Each pod's command, arguments and environment (ConfigMap, env, the downward API
# values a cluster would give) come from the rendered manifests (k8s_check.py); the test plays
# the kubelet: it starts the containers' commands, runs their probes, restarts a container
# that dies. It runs in a private network and mount namespace (unshare -mn): a /etc/hosts of
# its own resolves the Services' and pods' DNS names (chainps-scheduler,
# chainps-server-N.chainps-server.chainps.svc) to loopback addresses, one per pod, and the
# ports are the manifests' own (9091, 9092) with nothing else on them.
#
# The job: 3 servers, 2 workers training fmnist (sync). Checked: each probe's answer before the
# job starts, while it runs, while the scheduler is down and after the end; server 1's process
# killed with SIGKILL mid-run (a crashed container: restarted on its data directory, it
# rejoins with its rank and DNS name); the scheduler's pod deleted mid-run (TERM to its
# entrypoint, which kills the scheduler) and started again on its data directory (Recreate),
# resuming the job; both workers end with status 0 and the same checksum; the scheduler and
# the servers then stay up idle, probes passing, until deleted (TERM).
#
# usage: k8s_pods.sh CHAINPS_BIN FMNIST_BIN DEPLOY_DIR WORK_DIR     (root: unshare -mn)
# env: K8S_PODS_STEPS (fmnist --steps, default 6000: 30 to 60 s here)
# Exits 77 (skipped) where namespaces cannot be made (not root) or the Fashion-MNIST data
# (Debian's dataset-fashion-mnist) is not installed.
# shellcheck disable=SC2154 # pods.env (made below) defines servers, workers and each pod's arrays
set -euo pipefail

if [[ ${1:-} == --inner ]]; then
    inner=1
    shift
else
    inner=0
fi
chainps=$(readlink -f "${1:?usage: k8s_pods.sh CHAINPS_BIN FMNIST_BIN DEPLOY_DIR WORK_DIR}")
fmnist=$(readlink -f "${2:?FMNIST_BIN}")
deploy=$(cd "${3:?DEPLOY_DIR}" && pwd)
work=${4:?WORK_DIR}
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "$(date +%T.%3N) k8s_pods: $*"; }

if ((inner == 0)); then
    data=/usr/share/datasets/fashion-mnist
    if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
        say "FAIL: no Fashion-MNIST data in $data (scripts/deps.sh test installs dataset-fashion-mnist)"
        exit 1
    fi
    if [[ $(id -u) != 0 ]] || ! unshare -mn true 2>/dev/null; then
        say "SKIP: cannot make a private mount and network namespace (unshare -mn; root needed)"
        exit 77
    fi
    mkdir -p "$work"
    t=$(mktemp -d "$(cd "$work" && pwd)/k8s-pods.XXXXXX")
    rc=0
    # timeout ends the inner script (TERM), whose trap ends every process it started.
    timeout -k 10 420 unshare -mn "$0" --inner "$chainps" "$fmnist" "$deploy" "$t" || rc=$?
    if ((rc == 0)); then
        rm -rf "$t"
    else
        say "FAIL (status $rc); pods' logs kept in $t"
        for f in "$t"/*.log; do
            echo "---- $(basename "$f") (last 15 lines)"
            tail -n 15 "$f"
        done
    fi
    exit "$rc"
fi

# ---- inside the namespaces ----
t=$work
ip link set lo up
steps=${K8S_PODS_STEPS:-6000}

# Render the manifests and turn each pod into an environment and a command line.
py=python3
/usr/bin/python3 -c 'import yaml' 2>/dev/null && py=/usr/bin/python3
"$chainps" secret "$t/render.secret" >/dev/null
"$py" "$here/k8s_check.py" "$deploy" "$chainps" "$fmnist" --secret "$t/render.secret" \
    --out "$t/objects.json" >/dev/null
"$py" - "$t/objects.json" "$t" >"$t/pods.env" <<'EOF'
import json, shlex, sys
objs, t = json.load(open(sys.argv[1])), sys.argv[2]
cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
# Where each pod's volumes are here: mountPath -> directory of this test.
def remap(s, pod):
    for a, b in (("/var/lib/chainps-out", f"{t}/{pod}/out"), ("/var/lib/chainps", f"{t}/{pod}/data"),
                 ("/run/chainps", f"{t}/{pod}/run"), ("/etc/chainps/secret", f"{t}/secret")):
        s = s.replace(a, b)
    return s
def emit(kind, pod, c, extra):
    env = {}
    for ef in c.get("envFrom", []):
        env.update(cms[ef["configMapRef"]["name"]])
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", "")
    env.update(extra)
    env = {k: remap(v, pod) for k, v in env.items()}
    argv = [remap(a, pod) for a in c.get("command", []) + c.get("args", [])]
    argv = [a.replace("$(CHAINPS_SCHEDULER)", env["CHAINPS_SCHEDULER"]) for a in argv]
    env["CHAINPS_FINISHED_MARK"] = f"{t}/{pod}/run/finished"
    name = pod.replace("-", "_")
    print(f"{name}_env=({' '.join(shlex.quote(f'{k}={v}') for k, v in sorted(env.items()))})")
    print(f"{name}_cmd=({' '.join(shlex.quote(a) for a in argv)})")
    for p in ("ready", "live"):
        for pr in ("readinessProbe", "livenessProbe"):
            cmd = c.get(pr, {}).get("exec", {}).get("command")
            if cmd and cmd[-1] == p:
                print(f"{name}_{p}=({' '.join(shlex.quote(a) for a in cmd)})")
for o in objs:
    ns = o["metadata"].get("namespace", "default")
    if o["kind"] == "Deployment":
        c = o["spec"]["template"]["spec"]["containers"][0]
        # Pods share this network namespace: each listens for metrics on its own address.
        c2 = json.loads(json.dumps(c))
        c2["args"] = [a.replace("--metrics-bind=0.0.0.0", "--metrics-bind=127.0.0.10")
                      for a in c2["args"]]
        emit(o["kind"], "scheduler", c2, {"POD_IP": "127.0.0.10"})
    elif o["kind"] == "StatefulSet":
        c = o["spec"]["template"]["spec"]["containers"][0]
        for i in range(o["spec"]["replicas"]):
            pod = f"{o['metadata']['name']}-{i}"
            c2 = json.loads(json.dumps(c))
            c2["args"] = [a.replace("--bind=0.0.0.0", f"--bind=127.0.0.{11 + i}")
                          .replace("--metrics-bind=0.0.0.0", f"--metrics-bind=127.0.0.{11 + i}")
                          for a in c2["args"]]
            emit(o["kind"], f"server-{i}", c2, {"POD_NAME": pod, "POD_NAMESPACE": ns,
                                                 "CHAINPS_POD_INDEX": str(i)})
            print(f"server_{i}_dns={pod}.{o['spec']['serviceName']}.{ns}.svc")
            print(f"server_{i}_ip=127.0.0.{11 + i}")
        print(f"servers={o['spec']['replicas']}")
    elif o["kind"] == "Job":
        c = o["spec"]["template"]["spec"]["containers"][0]
        for i in range(o["spec"]["completions"]):
            emit(o["kind"], f"worker-{i}", c, {"JOB_COMPLETION_INDEX": str(i)})
        print(f"workers={o['spec']['completions']}")
EOF
# shellcheck disable=SC1091
source "$t/pods.env"

# The cluster's DNS, and the Secret as Kubernetes mounts it (fsGroup: group-readable).
{
    echo "127.0.0.1 localhost"
    echo "127.0.0.10 chainps-scheduler"
    for ((i = 0; i < servers; i++)); do
        dns=server_${i}_dns ip=server_${i}_ip
        echo "${!ip} ${!dns}"
    done
} >"$t/hosts"
mount --bind "$t/hosts" /etc/hosts
mkdir -p "$t/secret"
"$chainps" secret "$t/secret/job.secret" >/dev/null
chmod 0440 "$t/secret/job.secret"
# The image's PATH: chainps, fmnist, chainps-k8s.
mkdir -p "$t/bin"
ln -s "$chainps" "$t/bin/chainps"
ln -s "$fmnist" "$t/bin/fmnist"
ln -s "$deploy/chainps-k8s.sh" "$t/bin/chainps-k8s"
export PATH=$t/bin:$PATH

declare -A pid=()
cleanup() {
    local p
    for p in "${pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 1
    for p in "${pid[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${pid[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
fails=0
bad() {
    say "FAIL: $*"
    fails=$((fails + 1))
}

start() { # POD: run its container's command with its environment, log to POD.log
    local pod=$1 n=${1//-/_}
    local -n env=${n}_env cmd=${n}_cmd
    mkdir -p "$t/$pod/run" "$t/$pod/data" "$t/$pod/out"
    env "${env[@]}" "${cmd[@]}" >>"$t/$pod.log" 2>&1 &
    pid[$pod]=$!
}
probe() { # POD ready|live: the probe's exit status
    local pod=$1 n=${1//-/_}
    local -n env=${n}_env pr=${n}_$2
    env "${env[@]}" timeout 10 "${pr[@]}" >>"$t/$pod.probes" 2>&1
}
wait_probe() { # POD ready|live SECONDS
    local end=$((SECONDS + $3))
    while ((SECONDS < end)); do
        probe "$1" "$2" && return 0
        sleep 0.5
    done
    return 1
}
expect() { # POD ready|live 0|1 WHAT
    local rc=0
    probe "$1" "$2" || rc=1
    ((rc == $3)) && say "probe $2 of $1 $4: $rc, as expected" ||
        bad "probe $2 of $1 $4: $rc, expected $3"
}
child_of() { cat "$t/$1/run/chainps.pid"; } # as kubectl exec would find it

say "steps $steps; pods: scheduler, $servers servers, $workers workers"
for ((i = 0; i < workers; i++)); do
    n=worker_${i}_cmd
    # later flags win: enough epochs for --steps to be the limit
    eval "$n+=(--epochs=50 --steps=$steps --log-every=100)"
done
start scheduler
wait_probe scheduler ready 15 || bad "the scheduler never became ready"
expect scheduler live 0 "once up"
for ((i = 0; i < servers; i++)); do start "server-$i"; done
sleep 2
expect server-0 ready 1 "before the workers (job not started)"
expect server-0 live 0 "before the workers"
for ((i = 0; i < workers; i++)); do start "worker-$i"; done
for ((i = 0; i < servers; i++)); do
    wait_probe "server-$i" ready 60 || bad "server-$i never became ready"
done
say "every server ready; waiting for training"

# Server 1's container dies (SIGKILL to chainps, as the OOM killer would); the kubelet starts
# it again on the same volume.
for ((s = 0; s < 120; s++)); do
    grep -q 'step: 300,' "$t/worker-0.log" 2>/dev/null && break
    sleep 0.5
done
grep -q 'step: 300,' "$t/worker-0.log" || bad "worker 0 did not reach step 300"
# The pods' /metrics (the manifests' --metrics-port, each at its pod's address here).
for ep in "scheduler 127.0.0.10 chainps_job_push_bytes_total" \
    "server-0 127.0.0.11 chainps_server_pushes_total"; do
    read -r pod ip want <<<"$ep"
    if /usr/bin/python3 -c 'import sys, urllib.request as u
t = u.urlopen(f"http://{sys.argv[1]}:9100/metrics", timeout=5).read().decode()
sys.exit(0 if any(l.startswith(sys.argv[2]) and float(l.split()[-1]) > 0 for l in t.splitlines()) else 1)' "$ip" "$want"; then
        say "$pod serves /metrics with $want above 0"
    else
        bad "$pod's /metrics at $ip:9100 has no $want above 0"
    fi
done
victim=$(child_of server-1)
say "kill -9 server-1's chainps (pid $victim)"
kill -KILL "$victim"
rc=0
wait "${pid[server-1]}" || rc=$?
((rc == 137)) && say "server-1's entrypoint exited 137: the container is restarted" ||
    bad "server-1's entrypoint exited $rc, expected 137 (the server's status)"
start server-1
for ((s = 0; s < 120; s++)); do
    (($(grep -c 'joined as node .* (rank 1)' "$t/server-1.log") >= 2)) && break
    sleep 0.5
done
(($(grep -c 'joined as node .* (rank 1)' "$t/server-1.log") >= 2)) ||
    bad "the restarted server-1 did not rejoin with rank 1"
wait_probe server-1 ready 60 && say "server-1 rejoined with rank 1 and is ready: $(grep 'joined as node' "$t/server-1.log" | tail -1 | cut -c1-110)" ||
    bad "server-1 did not become ready after its restart"

# The scheduler's pod is deleted (TERM) and started again on its volume (Recreate).
say "TERM to the scheduler's entrypoint (pod deleted)"
kill -TERM "${pid[scheduler]}"
rc=0
wait "${pid[scheduler]}" || rc=$?
((rc != 0)) && say "scheduler's entrypoint exited $rc (killed: the job goes on)" ||
    bad "the scheduler's entrypoint exited 0: it ended the job"
expect server-0 live 0 "while the scheduler is down"
expect server-0 ready 1 "while the scheduler is down"
start scheduler
wait_probe scheduler ready 15 || bad "the restarted scheduler never became ready"
wait_probe server-0 ready 30 && say "server-0 ready again under the restarted scheduler" ||
    bad "server-0 not ready under the restarted scheduler"
env "${scheduler_env[@]}" chainps status --scheduler 127.0.0.10:9091 >"$t/status.txt" 2>&1 ||
    bad "chainps status"
grep -q '^job: running' "$t/status.txt" && say "restarted scheduler resumed: $(head -1 "$t/status.txt")" ||
    bad "the restarted scheduler did not resume the job: $(head -1 "$t/status.txt")"

# The workers finish (the Job completes); the others stay up, idle.
for ((i = 0; i < workers; i++)); do
    rc=0
    wait "${pid[worker-$i]}" || rc=$?
    unset "pid[worker-$i]"
    ((rc == 0)) || bad "worker $i exited $rc"
done
mapfile -t sums < <(grep -ho 'checksum [0-9a-f]*' "$t"/worker-*.log | sort -u)
if ((${#sums[@]} == 1)) && (($(grep -c '^final:' "$t"/worker-*.log | awk -F: '{s += $2} END {print s}') == workers)); then
    say "both workers finished: $(grep -h '^final:' "$t/worker-0.log")"
else
    bad "workers' final lines: ${sums[*]:-none}"
fi
for pod in scheduler server-0 server-1 server-2; do
    for ((s = 0; s < 40; s++)); do
        [[ -e $t/$pod/run/finished ]] && break
        sleep 0.5
    done
    [[ -e $t/$pod/run/finished ]] || bad "$pod did not record the job's end"
    kill -0 "${pid[$pod]}" 2>/dev/null || bad "$pod exited after the end (its pod would restart)"
done
expect server-2 live 0 "after the end"
expect scheduler ready 0 "after the end"
for pod in scheduler server-0 server-1 server-2; do
    kill -TERM "${pid[$pod]}"
    rc=0
    wait "${pid[$pod]}" || rc=$?
    unset "pid[$pod]"
    ((rc == 0)) || bad "$pod's entrypoint exited $rc on TERM after the end"
done
stat -c '%a' "$t/server-0/run/job.secret" | grep -qx 600 || bad "the secret's copy is not 0600"

if ((fails)); then
    say "$fails failure(s)"
    exit 1
fi
say "ok"
