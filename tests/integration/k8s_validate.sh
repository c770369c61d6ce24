#!/usr/bin/env bash
# ctest integration.k8s: the Kubernetes manifests of deploy/k8s/ and of its overlays beside it
# (deploy/k8s-*/, e.g. deploy/k8s-torch: the PyTorch workers), checked offline (no cluster and
# no container builder run here). Each step below runs on deploy/k8s and on every overlay.
#
# usage: k8s_validate.sh CHAINPS_BIN DEPLOY_DIR WORK_DIR [FMNIST_BIN]
#
#  1. yamllint on every manifest (when Debian's yamllint is installed), shellcheck on the
#     pods' entrypoint (when shellcheck is), bash -n always;
#  2. tests/integration/k8s_check.py (python3-yaml): renders the kustomization as
#     `kubectl apply -k` would and checks chainps's invariants (flags against `chainps ROLE
#     --help` and `fmnist --help`, ports, the secret's mount, counts, probes, security);
#  3. the Dockerfile: Debian 12 bases, every apt-get package known to apt-cache (the torch
#     variant's too), the runtime stage's packages covering what `ldd` says chainps, fmnist
#     and the Python extension load, COPY sources present;
#  4. `kubectl kustomize` (when a kubectl is installed) renders the same objects;
#  5. tests/integration/k8s_schema.mjs: every object against the Kubernetes OpenAPI schemas
#     (npm's kubernetes-models, installed with typescript into WORK_DIR/k8s-npm on first run);
#  6. the checkers must reject deliberately broken copies of the manifests (a wrong port, an
#     unknown field, a misspelt flag), so that a checker that passes everything fails here.
# Exit 0 when all ran and passed; 1 on any failure; 77 (skipped) when node/npm or the npm
# packages are not to be had, after steps 1-4 passed, saying so.
set -euo pipefail

chainps=${1:?usage: k8s_validate.sh CHAINPS_BIN DEPLOY_DIR WORK_DIR [FMNIST_BIN]}
deploy=$(cd "${2:?DEPLOY_DIR}" && pwd)
work=${3:?WORK_DIR}
fmnist=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
# The overlays: kustomizations beside deploy/k8s that build on it (kustomize refuses an overlay
# inside its base's directory).
overlays=()
for o in "$deploy"-*/kustomization.yaml; do
    [[ -f $o ]] && overlays+=("$(dirname "$o")")
done
mkdir -p "$work"
work=$(cd "$work" && pwd)
tmp=$(mktemp -d "$work/k8s-validate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
say() { echo "k8s_validate: $*"; }
bad() {
    echo "k8s_validate: FAIL: $*"
    fails=$((fails + 1))
}

[[ -x $chainps ]] || {
    say "chainps binary $chainps not found"
    exit 1
}
[[ -z $fmnist || -x $fmnist ]] || fmnist=""

# python3 with yaml: Debian's first (python3-yaml), else the one on PATH.
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import yaml' 2>/dev/null; then
        py=$p
        break
    fi
done
[[ -n $py ]] || {
    say "FAIL: no python3 with the yaml module (apt-get install python3-yaml)"
    exit 1
}

"$chainps" secret "$tmp/job.secret" >/dev/null

# 1. yamllint, shellcheck, bash -n.
if command -v yamllint >/dev/null; then
    conf='{extends: default, rules: {line-length: {max: 100}, document-start: disable,
           comments: {min-spaces-from-content: 1}}}'
    yamls=("$deploy"/*.yaml)
    for o in "${overlays[@]}"; do yamls+=("$o"/*.yaml); done
    if timeout 60 yamllint -s -d "$conf" "${yamls[@]}"; then
        say "yamllint: ok"
    else
        bad "yamllint"
    fi
else
    say "note: yamllint not installed (scripts/deps.sh test installs it): YAML style not linted"
fi
bash -n "$deploy/chainps-k8s.sh" || bad "bash -n chainps-k8s.sh"
if command -v shellcheck >/dev/null; then
    if timeout 60 shellcheck "$deploy/chainps-k8s.sh"; then
        say "shellcheck chainps-k8s.sh: ok"
    else
        bad "shellcheck chainps-k8s.sh"
    fi
else
    say "note: shellcheck not installed: chainps-k8s.sh checked with bash -n only"
fi

# 2. Render and check chainps's invariants.
check() { # DEPLOY_DIR OUT.json
    timeout 60 "$py" "$here/k8s_check.py" "$1" "$chainps" ${fmnist:+"$fmnist"} \
        --secret "$tmp/job.secret" --out "$2" --root "$(cd "$deploy/../.." && pwd)"
}
check "$deploy" "$tmp/objects.json" || bad "k8s_check.py"
for o in "${overlays[@]}"; do
    check "$o" "$tmp/objects-$(basename "$o").json" || bad "k8s_check.py $(basename "$o")"
done

# 3. The Dockerfile.
docker_check() {
    local df=$deploy/Dockerfile root
    root=$(cd "$deploy/../.." && pwd)
    mapfile -t froms < <(awk 'toupper($1) == "FROM" { print $2 }' "$df")
    ((${#froms[@]} >= 2)) || bad "Dockerfile: expected a builder and a runtime stage"
    for f in "${froms[@]}"; do
        [[ $f == debian:12* || $f == debian:bookworm* ]] || bad "Dockerfile: FROM $f is not Debian 12"
    done
    # Packages per stage: the words after "apt-get install" up to the next && or end of RUN.
    "$py" - "$df" >"$tmp/pkgs" <<'EOF'
import re, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
stage = -1
for line in text.splitlines():
    if re.match(r"\s*FROM\s", line, re.I):
        stage += 1
    for m in re.finditer(r"apt-get install ([^&;]*)", line):
        for w in m.group(1).split():
            if not w.startswith("-"):
                print(stage, w)
EOF
    [[ -s $tmp/pkgs ]] || bad "Dockerfile: no apt-get install found"
    # One apt-cache call for all of them (and dpkg, which every Debian's lists hold): each call
    # loads the package lists, 1-2 s a call on a loaded machine, which one call a package
    # multiplied into half a minute of the test's time.
    local known=0 missing=0 stage pkg listed
    listed=$(awk '{ print $2 }' "$tmp/pkgs" | sort -u |
        xargs apt-cache show dpkg 2>/dev/null | sed -n 's/^Package: //p' | sort -u || true)
    if grep -qx dpkg <<<"$listed"; then
        while read -r stage pkg; do
            if grep -qxF -- "$pkg" <<<"$listed"; then
                known=$((known + 1))
            else
                bad "Dockerfile: package $pkg (stage $stage) is not in apt-cache"
                missing=$((missing + 1))
            fi
        done <"$tmp/pkgs"
        say "Dockerfile: $known packages known to apt-cache, $missing unknown"
    else
        say "note: apt-cache has no package lists (apt-get update): Dockerfile packages not looked up"
    fi
    # The runtime stage (last) must bring every library chainps and fmnist load: a package it
    # names, or one apt installs with them (libmicrohttpd12 brings GnuTLS and its libraries).
    local last bin lib real owner p brought
    last=$(awk '{print $1}' "$tmp/pkgs" | sort -n | tail -1)
    brought=$(awk -v s="$last" '$1 == s { print $2 }' "$tmp/pkgs" |
        xargs -r apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances 2>/dev/null | grep -v '^ ' | sed 's/:.*//' |
        sort -u || true)
    # The torch variant's Python extension (built beside chainps when python3-dev is there).
    local ext
    ext=$(find "$(dirname "$chainps")/python/chainps" -name '_chainps*.so' 2>/dev/null | head -1)
    # The libraries each binary loads, and the package owning each (one dpkg -S for all: a
    # call reads dpkg's whole file database). A library's owner is that of its path as ldd
    # gives it, else of the file it resolves to, else of that under /lib (merged /usr).
    local -A libs_of=() owner_of=()
    local paths=() line path
    for bin in "$chainps" ${fmnist:+"$fmnist"} ${ext:+"$ext"}; do
        libs_of[$bin]=$(ldd "$bin" | awk '$3 ~ /^\// { print $3 }')
        while read -r lib; do
            [[ -n $lib ]] || continue
            real=$(readlink -f "$lib")
            paths+=("$lib" "$real" "${real/#\/usr\/lib\//\/lib\/}")
        done <<<"${libs_of[$bin]}"
    done
    # "owner[:arch]: path", the first line of a path kept as before (dpkg -S exits 1 when one
    # path has no owner).
    while IFS= read -r line; do
        path=/${line#*: /}
        [[ -n ${owner_of[$path]+set} ]] || owner_of[$path]=$(cut -d: -f1 <<<"$line")
    done < <(if ((${#paths[@]})); then dpkg -S "${paths[@]}" 2>/dev/null || true; fi)
    for bin in "$chainps" ${fmnist:+"$fmnist"} ${ext:+"$ext"}; do
        while read -r lib; do
            [[ -n $lib ]] || continue
            real=$(readlink -f "$lib")
            owner=""
            for p in "$lib" "$real" "${real/#\/usr\/lib\//\/lib\/}"; do
                [[ -n $owner ]] || owner=${owner_of[$p]:-}
            done
            case $owner in
            "" | libc6 | libgcc-s1 | libstdc++6 | libgfortran5 | libquadmath0) continue ;;
            # The sanitizer build's runtimes (this test runs in that build too): the image is
            # a release build, which loads none of them.
            libasan* | libubsan* | liblsan* | libtsan*) continue ;;
            esac
            # libopenblas0-pthread and friends: any OpenBLAS flavour will do.
            if ! grep -qx "$last $owner" "$tmp/pkgs" && ! grep -qx "$owner" <<<"$brought"; then
                bad "Dockerfile: $(basename "$bin") loads $lib ($owner), not installed in the runtime stage"
            fi
        done <<<"${libs_of[$bin]}"
    done
    # COPY sources from the context exist; the entrypoint is what the manifests run.
    while read -r src; do
        [[ -e $root/$src ]] || bad "Dockerfile: COPY $src: no such file in the repository"
    done < <(awk 'toupper($1) == "COPY" && $2 !~ /^--from/ && $2 != "." { print $2 }' "$df")
    grep -q 'COPY deploy/k8s/chainps-k8s.sh /usr/local/bin/chainps-k8s' "$df" ||
        bad "Dockerfile: chainps-k8s (the manifests' command) is not installed on PATH"
    grep -q '^USER [0-9]' "$df" || bad "Dockerfile: no numeric non-root USER"
    [[ -f $root/.dockerignore ]] || bad "no .dockerignore beside the build context's root"
    grep -qx 'build' "$root/.dockerignore" || bad ".dockerignore does not leave out build/"
    say "Dockerfile: structure checked (no container builder is run here)"
}
docker_check

# 4. kubectl kustomize, where a kubectl is installed: deploy/k8s and its overlays, copied as
# they lie (an overlay names its base as ../k8s), with a secret file.
kustomize_same() { # DIR_IN_COPY OBJECTS.json OUT.json: kubectl kustomize renders the same
    local dir=$1 mine=$2 out=$3 name
    name=$(basename "$dir")
    if ! timeout 60 kubectl kustomize "$dir" >"$out.yaml" 2>"$out.err"; then
        bad "kubectl kustomize $name: $(cat "$out.err")"
        return
    fi
    if "$py" - "$out.yaml" "$mine" "$out" <<'EOF'; then
import json, sys, yaml
ko = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
# kustomize wraps a Secret's base64 at 70 columns; the API server's decoder (Go's) skips the
# newlines, the schema's "byte" format does not: join them.
for o in ko:
    if o["kind"] == "Secret":
        o["data"] = {k: "".join(v.split()) for k, v in o.get("data", {}).items()}
mine = json.load(open(sys.argv[2]))
key = lambda o: (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
a, b = sorted(map(key, ko)), sorted(map(key, mine))
json.dump(ko, open(sys.argv[3], "w"))
if a != b:
    print("k8s_validate: FAIL: kubectl kustomize renders", a, "but k8s_check.py", b)
    sys.exit(1)
# The containers as both render them (patches and images applied), env compared as a set:
# kustomize puts a patch's new variables first, k8s_check.py last.
def containers(objs):
    out = {}
    for o in objs:
        for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            c = dict(c)
            c["env"] = sorted(json.dumps(e, sort_keys=True) for e in c.get("env", []))
            out[(o["kind"], o["metadata"]["name"], c["name"])] = json.dumps(c, sort_keys=True)
    return out
ca, cb = containers(ko), containers(mine)
diff = [k for k in ca if ca[k] != cb.get(k)]
if diff:
    print("k8s_validate: FAIL: kubectl kustomize and k8s_check.py render these containers "
          "differently:", diff)
    sys.exit(1)
EOF
        say "kubectl kustomize $name ($(kubectl version --client 2>/dev/null | head -1)): same objects and containers"
    else
        bad "kubectl kustomize and k8s_check.py disagree on $name"
    fi
}
if command -v kubectl >/dev/null; then
    mkdir -p "$tmp/kdir/k8s"
    cp "$deploy"/*.yaml "$tmp/kdir/k8s/"
    cp "$tmp/job.secret" "$tmp/kdir/k8s/job.secret"
    kustomize_same "$tmp/kdir/k8s" "$tmp/objects.json" "$tmp/kustomized.json"
    for o in "${overlays[@]}"; do
        n=$(basename "$o")
        cp -r "$o" "$tmp/kdir/$n"
        kustomize_same "$tmp/kdir/$n" "$tmp/objects-$n.json" "$tmp/kustomized-$n.json"
    done
else
    say "note: no kubectl: the kustomizations are rendered by k8s_check.py only"
fi

# 5. Schema validation with kubernetes-models (npm), into WORK_DIR/k8s-npm.
npm_dir=$work/k8s-npm
models_version=5.1.0
ts_version=5.9.3
schema=""
skip=""
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    skip="node or npm is not installed"
else
    have=$(node -e 'try{console.log(require(process.argv[1]).version)}catch(e){}' \
        "$npm_dir/node_modules/kubernetes-models/package.json" 2>/dev/null || true)
    if [[ $have != "$models_version" || ! -f $npm_dir/node_modules/typescript/bin/tsc ]]; then
        mkdir -p "$npm_dir"
        printf '{"name":"chainps-k8s-validate","private":true,"dependencies":{"kubernetes-models":"%s","typescript":"%s"}}\n' \
            "$models_version" "$ts_version" >"$npm_dir/package.json"
        say "installing kubernetes-models@$models_version and typescript@$ts_version into $npm_dir"
        # One install at a time (the plain and sanitizer builds' runs share the directory).
        if ! (cd "$npm_dir" && flock -w 300 "$npm_dir/.lock" \
            timeout 300 npm install --no-audit --no-fund --loglevel=error >"$tmp/npm.log" 2>&1); then
            skip="npm install kubernetes-models@$models_version typescript@$ts_version failed: $(grep -v nodedir "$tmp/npm.log" | tail -3)"
        fi
    fi
fi
if [[ -z $skip ]]; then
    schema=ok
    files=("$tmp"/objects*.json)
    for f in "$tmp"/kustomized*.json; do [[ -f $f ]] && files+=("$f"); done
    timeout 180 node "$here/k8s_schema.mjs" "$npm_dir" "${files[@]}" || {
        bad "schema validation"
        schema=failed
    }
fi

# 6. The checkers must catch deliberate breakage (each on a copy of deploy/k8s and its
# overlays, laid out as they are).
mutant() { # NAME FILE OLD NEW PATTERN [schema]: the checkers must fail on FILE with OLD made
    # NEW, with a FAIL line matching PATTERN ("schema": only the schema validator can see it).
    # FILE is in deploy/k8s, or OVERLAY/FILE (e.g. k8s-torch/workers-torch.yaml): then the
    # overlay is what is checked.
    local name=$1 file=$2 old=$3 new=$4 pattern=$5 only=${6:-} d=$tmp/mutant-$1 dir o
    mkdir -p "$d"
    cp -r "$deploy" "$d/$(basename "$deploy")"
    for o in "${overlays[@]}"; do cp -r "$o" "$d/$(basename "$o")"; done
    if [[ $file == */* ]]; then
        dir=$d/${file%%/*}
    else
        dir=$d/$(basename "$deploy")
        file=$(basename "$deploy")/$file
    fi
    "$py" -c 'import sys; p, a, b = sys.argv[1:]; s = open(p).read(); assert a in s, a
open(p, "w").write(s.replace(a, b, 1))' "$d/$file" "$old" "$new"
    local caught=""
    check "$dir" "$d.json" >"$d.log" 2>&1 || caught="k8s_check.py"
    if [[ -z $caught && $schema == ok ]]; then
        timeout 180 node "$here/k8s_schema.mjs" "$npm_dir" "$d.json" >>"$d.log" 2>&1 ||
            caught="k8s_schema.mjs"
    fi
    if [[ -n $caught ]] && grep FAIL "$d.log" | grep -qF -- "$pattern"; then
        say "broken on purpose ($name): caught by $caught: $(grep FAIL "$d.log" | grep -m1 -F -- "$pattern" | cut -c1-150)"
    elif [[ -n $caught ]]; then
        bad "broken on purpose ($name): $caught failed, but not on it: $(grep -m1 FAIL "$d.log")"
    elif [[ $schema != ok && $only == schema ]]; then
        say "broken on purpose ($name): not checked (no schema validator)"
    else
        bad "broken on purpose ($name) and nothing noticed"
    fi
}
if ((fails)); then
    say "the manifests as they are fail: the deliberately broken copies are not tried"
else
    mutant service-port scheduler.yaml "      port: 9091" "      port: 9093" "port 9093"
    mutant container-port servers.yaml "containerPort: 9092" "containerPort: 9093" "container port 9093"
    mutant unknown-field servers.yaml "terminationGracePeriodSeconds: 30" \
        "terminationGracePeriod: 30" "terminationGracePeriod" schema
    mutant bad-type workers.yaml "  backoffLimit: 6" "  backoffLimit: six" "backoffLimit" schema
    mutant flag workers.yaml "            - --epochs=5" "            - --epoch=5" "--epoch "
    mutant secret-path configmap.yaml '"/etc/chainps/secret/job.secret"' \
        '"/etc/chainps/job.secret"' "CHAINPS_SECRET_MOUNT"
    mutant count servers.yaml "  completions: 3" "  completions: 4" "completions/parallelism 4/3"
    # The end of the job: a pod that exits 0 must not be started again.
    mutant restart scheduler.yaml "restartPolicy: OnFailure" "restartPolicy: Always" \
        "restartPolicy must be OnFailure"
    mutant subdomain servers.yaml "subdomain: chainps-server" "subdomain: chainps-servers" \
        "pod subdomain chainps-servers"
    # The PodDisruptionBudget.
    mutant pdb-max pdb.yaml "  minAvailable: 2" "  maxUnavailable: 2" "maxUnavailable is not applied"
    mutant pdb-count pdb.yaml "  minAvailable: 2" "  minAvailable: 1" "minAvailable 1 != "
    mutant pdb-selector pdb.yaml "      app.kubernetes.io/component: server" \
        "      app.kubernetes.io/component: worker" "0 select the server pods"
    mutant pdb-percent pdb.yaml "  minAvailable: 2" '  minAvailable: "66%"' "must be a whole number"
    # The NetworkPolicies.
    mutant netpol-from networkpolicy.yaml "              app.kubernetes.io/part-of: chainps" \
        "              app.kubernetes.io/component: scheduler" "does not admit the server pods"
    mutant netpol-port networkpolicy.yaml "port: 9092 # the server" "port: 9093 # the server" \
        "container port 9092 is not admitted"
    mutant netpol-range networkpolicy.yaml "endPort: 59999" "endPort: 39999" \
        "20000-59999 (chainps's inboxes"
    mutant netpol-any networkpolicy.yaml "    - from:" "    - ports:" "without \`from\`"
    mutant netpol-egress networkpolicy.yaml "policyTypes: [\"Ingress\"]" \
        "policyTypes: [\"Egress\"]" "policyTypes has no Ingress"
fi
for o in "${overlays[@]}"; do
    ((fails)) && break
    [[ $(basename "$o") == k8s-torch ]] || continue
    mutant torch-flag k8s-torch/workers-torch.yaml "--epochs=2" "--epoch=2" \
        "flag --epoch is not one of \`train.py --help\`"
    mutant torch-threads k8s-torch/workers-torch.yaml 'value: "1"' 'value: "4"' "OMP_NUM_THREADS 4"
    mutant torch-image k8s-torch/workers-torch.yaml "image: chainps-torch:0.1" \
        "image: chainps:0.1" "is not the torch variant"
    mutant torch-script k8s-torch/workers-torch.yaml "/examples/torch/train.py" \
        "/examples/torch/tran.py" "does not run /usr/local/share"
    mutant torch-save k8s-torch/workers-torch.yaml "--save=/var/lib/chainps-out/model.pt" \
        "--save=/model.pt" "--save /model.pt is not on a volume"
    mutant torch-unknown k8s-torch/workers-torch.yaml "          resources:" "          resource:" \
        "resource" schema
done

if ((fails)); then
    say "$fails failure(s)"
    exit 1
fi
if [[ -n $skip ]]; then
    say "SKIP: the manifests were not validated against the Kubernetes schemas: $skip"
    exit 77
fi
say "ok: deploy/k8s${overlays:+ and ${#overlays[@]} overlay(s)} parsed, rendered, consistent and valid against the Kubernetes schemas"
