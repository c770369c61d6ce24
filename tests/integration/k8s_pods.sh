#!/usr/bin/env bash
# ctest integration.k8s_pods (deploy/k8s) and long.k8s_pods_torch (deploy/k8s-torch: the
# PyTorch workers): the pods of a kustomization run as their manifests say, without Kubernetes. Each pod's command, arguments and environment (ConfigMap, env, the downward API
# values a cluster would give) come from the rendered manifests (k8s_check.py); the test plays
# the kubelet: it starts the containers' commands, runs their probes, restarts a container
# that dies. It runs in a private network and mount namespace (unshare -mn): a /etc/hosts of
# its own resolves the Services' and pods' DNS names (chainps-scheduler,
# chainps-server-N.chainps-server.chainps.svc) to loopback addresses, one per pod, and the
# ports are the manifests' own (9091, 9092) with nothing else on them.
#
# The job: 3 servers, 2 workers training fmnist or examples/torch/train.py (sync). Checked: each
# probe's answer before the job starts, while it runs and while the scheduler is down; server
# 1's process killed with SIGKILL mid-run (a crashed container: restarted in its pod on its
# data directory, it rejoins with its rank and DNS name); server 2's pod deleted (TERM: its
# entrypoint must exit non-zero) and replaced by one with an empty data directory, which
# rejoins and becomes ready once its copies are done; the scheduler's pod deleted mid-run
# (TERM to its entrypoint, which kills the scheduler) and started again on its data directory,
# resuming the job; both workers end with status 0 and the same checksum; then the scheduler
# and every server exit 0 by themselves (their Jobs complete: nothing restarts them).
#
# usage: k8s_pods.sh CHAINPS_BIN FMNIST_BIN DEPLOY_DIR WORK_DIR [PYTHON_DIR]  (root: unshare -mn)
#   PYTHON_DIR: the build's python/ (the chainps package), for a kustomization whose workers
#   run python3 (the torch image has it in /usr/local/lib/python3.X/dist-packages); python3 is
#   Debian's /usr/bin/python3, with python3-torch and python3-numpy, as in the image.
# env: K8S_PODS_STEPS (the workers' --steps, default 3000: fmnist about 55 s here, every event
#   done by step 800 on a quiet machine; train.py about 80 s, its events done by step 600 quiet and
#   near step 2000 under a heavy load. The check after the scheduler's restart fails, saying so,
#   if the workers finished first)
# Exits 77 (skipped) where namespaces cannot be made (not root), the Fashion-MNIST data
# (Debian's dataset-fashion-mnist) is not installed, or (PyTorch workers) /usr/bin/python3
# cannot import torch and numpy.
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
pydir=${5:-}
[[ -n $pydir ]] && pydir=$(readlink -f "$pydir")
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "$(date +%T.%3N) k8s_pods: $*"; }

if ((inner == 0)); then
    data=/usr/share/datasets/fashion-mnist
    if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
        say "FAIL: no Fashion-MNIST data in $data (scripts/deps.sh test installs dataset-fashion-mnist)"
        exit 1
    fi
    if [[ -n $pydir ]] && ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
        say "SKIP: /usr/bin/python3 cannot import torch and numpy (apt-get install python3-torch python3-numpy)"
        exit 77
    fi
    if [[ -n $pydir && ! -f $pydir/chainps/__init__.py ]]; then
        say "FAIL: no chainps Python package in $pydir"
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
    timeout -k 10 420 unshare -mn "$0" --inner "$chainps" "$fmnist" "$deploy" "$t" ${pydir:+"$pydir"} || rc=$?
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
steps=${K8S_PODS_STEPS:-3000}
root=$(cd "$deploy/../.." && pwd)

# Render the manifests and turn each pod into an environment and a command line.
py=python3
/usr/bin/python3 -c 'import yaml' 2>/dev/null && py=/usr/bin/python3
"$chainps" secret "$t/render.secret" >/dev/null
"$py" "$here/k8s_check.py" "$deploy" "$chainps" "$fmnist" --secret "$t/render.secret" \
    --out "$t/objects.json" >/dev/null
"$py" - "$t/objects.json" "$t" "$root" >"$t/pods.env" <<'EOF'
import json, random, shlex, string, sys
objs, t, root = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
cms = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
# Where each pod's volumes are here: mountPath -> directory of this test.
def remap(s, pod):
    for a, b in (("/var/lib/chainps-out", f"{t}/{pod}/out"), ("/var/lib/chainps", f"{t}/{pod}/data"),
                 ("/run/chainps", f"{t}/{pod}/run"), ("/etc/chainps/secret", f"{t}/secret"),
                 # the torch image's copy of the example
                 ("/usr/local/share/chainps/examples", f"{root}/examples")):
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
def suffix():  # the random end of a Job's pod name
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(5))
for o in objs:
    ns = o["metadata"].get("namespace", "default")
    comp = o["metadata"].get("labels", {}).get("app.kubernetes.io/component")
    if o["kind"] != "Job":
        continue
    if comp == "scheduler":
        c = o["spec"]["template"]["spec"]["containers"][0]
        # Pods share this network namespace: each listens for metrics on its own address.
        c2 = json.loads(json.dumps(c))
        c2["args"] = [a.replace("--metrics-bind=0.0.0.0", "--metrics-bind=127.0.0.10")
                      for a in c2["args"]]
        emit(o["kind"], "scheduler", c2, {"POD_IP": "127.0.0.10"})
    elif comp == "server":
        # An Indexed Job's pod: JOB_COMPLETION_INDEX from Kubernetes, JOB_NAME and the
        # namespace from the downward API; its host name JOB-INDEX under the subdomain.
        ps = o["spec"]["template"]["spec"]
        c = ps["containers"][0]
        name = o["metadata"]["name"]
        for i in range(o["spec"]["completions"]):
            c2 = json.loads(json.dumps(c))
            c2["args"] = [a.replace("--bind=0.0.0.0", f"--bind=127.0.0.{11 + i}")
                          .replace("--metrics-bind=0.0.0.0", f"--metrics-bind=127.0.0.{11 + i}")
                          for a in c2["args"]]
            emit(o["kind"], f"server-{i}", c2, {"JOB_NAME": name, "POD_NAMESPACE": ns,
                                                 "JOB_COMPLETION_INDEX": str(i),
                                                 "POD_NAME": f"{name}-{i}-{suffix()}"})
            print(f"server_{i}_dns={name}-{i}.{ps['subdomain']}.{ns}.svc")
            print(f"server_{i}_ip=127.0.0.{11 + i}")
        print(f"servers={o['spec']['completions']}")
    elif comp == "worker":
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
base=$deploy
[[ -f $base/chainps-k8s.sh ]] || base=$(cd "$deploy/../k8s" && pwd) # an overlay's base
ln -s "$base/chainps-k8s.sh" "$t/bin/chainps-k8s"
# The torch image: Debian's python3 with torch and numpy, the chainps package on its path.
ln -s /usr/bin/python3 "$t/bin/python3"
[[ -n $pydir ]] && export PYTHONPATH=$pydir
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
rejoined() { # RANK WHO WHEN: server RANK, started again, joins a second time and is ready
    local pod=server-$1 s
    for ((s = 0; s < 120; s++)); do
        (($(grep -c "joined as node .* (rank $1)" "$t/$pod.log") >= 2)) && break
        sleep 0.5
    done
    (($(grep -c "joined as node .* (rank $1)" "$t/$pod.log") >= 2)) ||
        bad "$2 did not rejoin with rank $1"
    if wait_probe "$pod" ready 60; then
        say "$2 rejoined with rank $1 and is ready: $(grep 'joined as node' "$t/$pod.log" | tail -1 | cut -c1-110)"
    else
        bad "$2 did not become ready $3"
    fi
}

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
rejoined 1 "server-1" "after its restart"

# Server 2's pod is deleted (an eviction the PodDisruptionBudget allowed): TERM to its
# entrypoint, which must end non-zero (a Job would count a pod that ends 0 as its index done
# and not replace it); the Job's new pod for index 2 has an empty data volume and run
# directory, joins with rank 2 under the same DNS name and copies its ranges back.
say "TERM to server-2's entrypoint (pod deleted)"
kill -TERM "${pid[server-2]}"
rc=0
wait "${pid[server-2]}" || rc=$?
((rc != 0)) && say "server-2's entrypoint exited $rc: the Job replaces the pod" ||
    bad "server-2's entrypoint exited 0 on TERM: its Job would count index 2 complete"
rm -rf "$t/server-2/data" "$t/server-2/run"
start server-2
rejoined 2 "server-2's new pod (empty volume)" "in its new pod"

# The scheduler's pod is deleted (TERM) and started again on its volume.
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
    bad "the restarted scheduler did not resume the job: $(head -1 "$t/status.txt")$(grep -qs '^final:' "$t"/worker-*.log && echo " (the workers had finished: raise K8S_PODS_STEPS above $steps)")"

# The workers finish (their Job completes); then the scheduler ends the job and it and every
# server exit 0 by themselves: their Jobs complete too, with restartPolicy OnFailure nothing
# starts them again.
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
end=$((SECONDS + 30))
for pod in scheduler server-0 server-1 server-2; do
    while kill -0 "${pid[$pod]}" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
    if kill -0 "${pid[$pod]}" 2>/dev/null; then
        bad "$pod still runs 30 s after the workers finished (its pod would idle)"
        continue
    fi
    rc=0
    wait "${pid[$pod]}" || rc=$?
    unset "pid[$pod]"
    if ((rc == 0)) && [[ -e $t/$pod/run/finished ]]; then
        say "$pod exited 0 at the job's end: its Job completes, no restart"
    else
        bad "$pod's entrypoint exited $rc at the job's end (finished mark: $([[ -e $t/$pod/run/finished ]] && echo yes || echo no))"
    fi
done
stat -c '%a' "$t/server-0/run/job.secret" | grep -qx 600 || bad "the secret's copy is not 0600"

if ((fails)); then
    say "$fails failure(s)"
    exit 1
fi
say "ok"
