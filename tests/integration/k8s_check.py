#!/usr/bin/env python3
"""Render deploy/k8s/ (or an overlay of it) as `kubectl apply -k` would and check what the
schema cannot.

usage: k8s_check.py DEPLOY_DIR CHAINPS_BIN [FMNIST_BIN] --secret FILE --out OBJECTS.json
                    [--root REPO]
       (DEPLOY_DIR: deploy/k8s, or an overlay such as deploy/k8s/torch)

Renders the kustomization (resources, including a base directory, namespace, secretGenerator
from FILE, generatorOptions, images, strategic-merge patches: the features they use; anything
else in it is refused), writes the objects as a JSON list to OBJECTS.json for the schema
validator, and checks chainps's own invariants: every flag a container passes exists in
`chainps ROLE --help` (or `fmnist --help`, or the PyTorch example's `train.py --help`), the
ports agree between the Services, the arguments, the ConfigMap and the containers, the secret
is mounted where the ConfigMap points, counts agree, labels select what they should, the
scheduler and the servers are Jobs whose pods end with the job, the PodDisruptionBudget and
the NetworkPolicies select the right pods and ports, probes are there with generous liveness
thresholds, and the pods run non-root with a read-only root filesystem. Every failure is
printed; exit 1 if any, 0 otherwise.
"""
import argparse
import copy
import json
import os
import re
import subprocess
import sys

import yaml

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def load_yaml_docs(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "apiVersion" not in d or "kind" not in d:
            err(path, "a document without apiVersion and kind")
    return docs


KUSTOMIZE_KEYS = {"apiVersion", "kind", "namespace", "resources", "secretGenerator",
                  "generatorOptions", "images", "patches"}
# Lists a strategic-merge patch merges item by item (by this key), as Kubernetes' patch
# strategy for them says; every other list is replaced whole.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name",
              "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort"}


def merge_patch(base, patch, key=None):
    """A strategic merge patch (the subset these manifests use: maps merged, the MERGE_KEYS
    lists merged by their key, other lists and scalars replaced)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge_patch(base[k], v, k) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        out = list(base)
        for item in patch:
            at = [i for i, b in enumerate(out) if isinstance(b, dict) and b.get(mk) == item.get(mk)]
            if at:
                out[at[0]] = merge_patch(out[at[0]], item)
            else:
                out.append(item)
        return out
    return patch


ROOT = None  # the repository (--root; default: two levels above deploy/k8s)
IMAGE_NAMES = set()  # the images named under `images:` in the kustomization and its bases


def render(deploy, secret_file, nested=False):
    kpath = os.path.join(deploy, "kustomization.yaml")
    with open(kpath) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - KUSTOMIZE_KEYS
    if unknown:
        err(kpath, f"fields this check does not render: {sorted(unknown)}")
    if k.get("kind") != "Kustomization":
        err(kpath, "kind is not Kustomization")
    listed = k.get("resources", [])
    patches = k.get("patches", [])
    used = set(listed) | {p.get("path") for p in patches}
    on_disk = sorted(f for f in os.listdir(deploy) if f.endswith((".yaml", ".yml"))
                     and f != "kustomization.yaml")
    for f in on_disk:
        if f not in used:
            err(kpath, f"{f} is in {deploy} but not in resources or patches")
    objs = []
    for r in listed:
        p = os.path.join(deploy, r)
        if os.path.isdir(p):  # a base: its kustomization rendered first
            _, base = render(p, secret_file, nested=True)
            objs.extend(base)
            continue
        if not os.path.isfile(p):
            err(kpath, f"resource {r} does not exist")
            continue
        for d in load_yaml_docs(p):
            d["_file"] = r
            objs.append(d)
    for pt in patches:
        if set(pt) - {"path"}:
            err(kpath, f"patch {pt}: only `path:` strategic-merge patches are rendered here")
            continue
        for d in load_yaml_docs(os.path.join(deploy, pt["path"])):
            hit = [i for i, o in enumerate(objs) if o["kind"] == d["kind"]
                   and o["metadata"]["name"] == d["metadata"]["name"]]
            if len(hit) != 1:
                err(kpath, f"patch {pt['path']}: {d['kind']} {d['metadata']['name']} matches "
                    f"{len(hit)} objects")
                continue
            o = objs[hit[0]]
            patched = merge_patch(o, {a: b for a, b in d.items() if a != "metadata"})
            patched["_file"] = f"{o['_file']} + {pt['path']}"
            objs[hit[0]] = patched
    opts = k.get("generatorOptions", {})
    for g in k.get("secretGenerator", []):
        data = {}
        for spec in g.get("files", []):
            key, _, src = spec.partition("=")
            src = src or key
            key = os.path.basename(key)
            src = os.path.join(deploy, src)
            if not os.path.isfile(src):
                # the operator makes it with `chainps secret`; the test supplies one
                src = secret_file
            with open(src, "rb") as f:
                import base64
                data[key] = base64.b64encode(f.read()).decode()
        name = g["name"]
        if not opts.get("disableNameSuffixHash"):
            err(kpath, "name suffix hashes are on: the manifests name the Secret without one")
        objs.append({"apiVersion": "v1", "kind": "Secret", "type": g.get("type", "Opaque"),
                     "metadata": {"name": name, "labels": dict(opts.get("labels", {}))},
                     "data": data, "_file": "kustomization.yaml"})
    ns = k.get("namespace")
    for o in objs:
        if ns and o["kind"] != "Namespace":
            o.setdefault("metadata", {})["namespace"] = ns
    images = {i["name"]: i for i in k.get("images", [])}
    IMAGE_NAMES.update(i.get("newName", n) for n, i in images.items())
    for o in objs:
        for c in containers_of(o):
            name, _, tag = c.get("image", "").partition(":")
            if name in images:
                c["image"] = images[name].get("newName", name) + ":" + images[name].get(
                    "newTag", tag)
            elif IMAGE_NAMES and not nested and name not in IMAGE_NAMES:
                err(o["_file"], f"image {c.get('image')} is not under the kustomizations' images")
    if ns and not nested and not any(o["kind"] == "Namespace" and o["metadata"]["name"] == ns
                                     for o in objs):
        err(kpath, f"namespace {ns} has no Namespace object")
    if not nested and not any(o["kind"] == "Namespace" for o in objs):
        err(kpath, "no Namespace object")
    return k, objs


def pod_spec(o):
    s = o.get("spec", {})
    if o["kind"] in ("Deployment", "StatefulSet", "Job"):
        return s.get("template", {}).get("spec", {})
    return None


def containers_of(o):
    ps = pod_spec(o)
    if not ps:
        return []
    return ps.get("containers", []) + ps.get("initContainers", [])


def find(objs, kind, name=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs, kind, name=None, where="objects"):
    got = find(objs, kind, name)
    if len(got) != 1:
        err(where, f"expected one {kind}{' ' + name if name else ''}, found {len(got)}")
        return None
    return got[0]


def help_flags(binary, *cmd):
    try:
        r = subprocess.run([binary, *cmd, "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        err(binary, f"cannot run {' '.join(cmd)} --help: {e}")
        return set()
    text = r.stdout + r.stderr
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


def env_of(c, configmaps):
    env = {}
    for ef in c.get("envFrom", []):
        ref = ef.get("configMapRef", {}).get("name")
        if ref in configmaps:
            env.update(configmaps[ref].get("data", {}))
        elif ref:
            err(c["name"], f"envFrom names ConfigMap {ref}, which is not rendered")
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "valueFrom" in e:
            env[e["name"]] = "<from " + json.dumps(e["valueFrom"], sort_keys=True) + ">"
    return env


def expand(s, env):
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), s)


def parse_flags(args):
    """['--a=1', '--b', '2', '--c'] -> {'--a': '1', '--b': '2', '--c': None} (values may
    also follow as the next item)."""
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                val, i = args[i + 1], i + 1
            out[name] = val if (eq or val) else None
        i += 1
    return out


def mounts_of(c):
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def under_mount(path, c):
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts_of(c))


def component(objs, kind, comp, where):
    """The one object of KIND whose app.kubernetes.io/component label is COMP."""
    got = [o for o in objs if o["kind"] == kind and
           o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == comp]
    if len(got) != 1:
        err(where, f"expected one {kind} of component {comp}, found {len(got)}")
        return None
    return got[0]


def selects(selector, labels):
    """Does a matchLabels selector select these labels? (matchExpressions: not used here.)"""
    ml = (selector or {}).get("matchLabels")
    if (selector or {}).get("matchExpressions"):
        err("selector", "matchExpressions are not checked here")
    return bool(ml) and all(labels.get(a) == b for a, b in ml.items())


def base_dir(deploy):
    """deploy/k8s, for itself or for an overlay of it (a kustomization whose resources name
    it): the directory of the entrypoint and the Dockerfile."""
    d = os.path.abspath(deploy)
    if os.path.isfile(os.path.join(d, "chainps-k8s.sh")):
        return d
    with open(os.path.join(d, "kustomization.yaml")) as f:
        for r in yaml.safe_load(f).get("resources", []):
            if os.path.isdir(os.path.join(d, r)):
                return base_dir(os.path.join(d, r))
    err(deploy, "neither chainps-k8s.sh here nor a base directory with it")
    return d


def transport_port_range(root):
    """TP_PORT_LO..TP_PORT_HI of src/transport/transport.c: where inboxes bound to port 0
    (workers, export readers, `chainps status`) find their port."""
    try:
        with open(os.path.join(root, "src", "transport", "transport.c")) as f:
            text = f.read()
        lo = int(re.search(r"#define TP_PORT_LO\s+(\d+)", text).group(1))
        hi = int(re.search(r"#define TP_PORT_HI\s+(\d+)", text).group(1))
        return lo, hi
    except (OSError, AttributeError) as e:
        err("src/transport/transport.c", f"cannot read TP_PORT_LO/HI: {e}")
        return None


def check(deploy, chainps, fmnist, k, objs):
    where = "deploy/k8s"
    cms = {o["metadata"]["name"]: o for o in find(objs, "ConfigMap")}
    secrets = {o["metadata"]["name"]: o for o in find(objs, "Secret")}
    cfg = one(objs, "ConfigMap", where=where)
    # The scheduler and the servers are Jobs (their pods end when the job does), like the
    # workers; each is known by its component label.
    sched_dep = component(objs, "Job", "scheduler", where)
    sts = component(objs, "Job", "server", where)
    job = component(objs, "Job", "worker", where)
    for kind in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"):
        for o in find(objs, kind):
            err(f"{kind} {o['metadata']['name']}", "restarts its pods when they exit 0: the "
                "scheduler and the servers must be Jobs, whose pods end with the job")
    if not (cfg and sched_dep and sts and job):
        return
    data = cfg.get("data", {})
    base = base_dir(deploy)
    root = ROOT or os.path.dirname(os.path.dirname(base))
    wrapper = os.path.join(base, "chainps-k8s.sh")

    # Labels: every object carries the app's; selectors match their pod templates.
    for o in objs:
        lab = o.get("metadata", {}).get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/part-of"):
            if key not in lab:
                err(f"{o['_file']} {o['kind']} {o['metadata'].get('name')}", f"no label {key}")
    labels = {}  # component -> its pods' labels
    for w in (sched_dep, sts, job):
        tl = w["spec"]["template"].get("metadata", {}).get("labels", {})
        labels[tl.get("app.kubernetes.io/component")] = tl
        if w["spec"].get("selector") or w["spec"].get("manualSelector"):
            err(w["metadata"]["name"], "a Job's selector is Kubernetes' to make")
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/part-of",
                    "app.kubernetes.io/component"):
            if key not in tl:
                err(w["metadata"]["name"], f"pod template has no label {key}")

    # Counts.
    for key in ("CHAINPS_NUM_SERVERS", "CHAINPS_NUM_WORKERS", "CHAINPS_REPLICAS", "CHAINPS_MODE",
                "CHAINPS_SCHEDULER", "CHAINPS_SERVER_SERVICE", "CHAINPS_SECRET_MOUNT",
                "CHAINPS_SECRET_FILE"):
        if key not in data:
            err("ConfigMap", f"no {key}")
    try:
        ns_, nw, nr = (int(data.get(x, "-1")) for x in
                       ("CHAINPS_NUM_SERVERS", "CHAINPS_NUM_WORKERS", "CHAINPS_REPLICAS"))
    except ValueError:
        err("ConfigMap", "server, worker and replica counts must be whole numbers")
        ns_ = nw = nr = -1
    vs = sts["spec"]
    if vs.get("completions") != ns_ or vs.get("parallelism") != ns_:
        err("servers' Job", f"completions/parallelism {vs.get('completions')}/"
            f"{vs.get('parallelism')} != CHAINPS_NUM_SERVERS {ns_} (replicas {ns_})")
    js = job["spec"]
    if js.get("completions") != nw or js.get("parallelism") != nw:
        err("Job", f"completions/parallelism {js.get('completions')}/{js.get('parallelism')} "
            f"!= CHAINPS_NUM_WORKERS {nw}")
    if not 1 <= nr <= ns_:
        err("ConfigMap", f"CHAINPS_REPLICAS {nr} must be 1..{ns_}")
    if not re.fullmatch(r"sync|async|ssp:\d+", data.get("CHAINPS_MODE", "")):
        err("ConfigMap", f"CHAINPS_MODE {data.get('CHAINPS_MODE')!r}")
    if js.get("completionMode") != "Indexed":
        err("Job", "completionMode is not Indexed (rank comes from JOB_COMPLETION_INDEX)")
    if vs.get("completionMode") != "Indexed":
        err("servers' Job", "completionMode is not Indexed (rank comes from JOB_COMPLETION_INDEX)")
    ss = sched_dep["spec"]
    if ss.get("completions", 1) != 1 or ss.get("parallelism", 1) != 1:
        err("scheduler's Job", "the scheduler must have exactly 1 pod (completions, parallelism)")
    # The end of the job: chainps scheduler and chainps server exit 0 then, and their pods must
    # end there; a crash (non-zero) restarts the container in its pod, on its volumes.
    for w in (sched_dep, sts):
        name = w["metadata"]["name"]
        if w["spec"]["template"]["spec"].get("restartPolicy") != "OnFailure":
            err(name, "restartPolicy must be OnFailure: exit 0 ends the pod with the job, a "
                "crash restarts the container on its volumes")
        if w["spec"].get("podReplacementPolicy") != "Failed":
            err(name, "podReplacementPolicy must be Failed: a replacement starts only once the "
                "old pod is gone (two processes of one rank or one volume)")
        if w["spec"].get("ttlSecondsAfterFinished") is not None:
            err(name, "ttlSecondsAfterFinished would delete the finished pods and their logs")

    # Scheduler address and ports.
    shost, _, sport = data.get("CHAINPS_SCHEDULER", ":").rpartition(":")
    ssvc = one(objs, "Service", shost, where="CHAINPS_SCHEDULER")
    sc = sched_dep["spec"]["template"]["spec"]["containers"][0]
    senv = env_of(sc, cms)
    sflags = parse_flags([expand(a, senv) for a in sc.get("args", [])])
    if sflags.get("--port") != sport:
        err("scheduler", f"--port {sflags.get('--port')} != CHAINPS_SCHEDULER's port {sport}")
    if sflags.get("--bind") not in ("0.0.0.0",):
        err("scheduler", "--bind must be 0.0.0.0: other pods reach it through its Service")
    cports = {p.get("name"): p["containerPort"] for p in sc.get("ports", [])}
    if str(cports.get("scheduler")) != sport:
        err("scheduler", f"containerPort 'scheduler' {cports.get('scheduler')} != {sport}")
    if ssvc:
        if ssvc["spec"].get("type", "ClusterIP") != "ClusterIP":
            err("scheduler Service", "not ClusterIP")
        p = ssvc["spec"]["ports"][0]
        if str(p["port"]) != sport:
            err("scheduler Service", f"port {p['port']} != {sport}")
        tp = p.get("targetPort", p["port"])
        if tp not in cports and str(tp) != sport:
            err("scheduler Service", f"targetPort {tp} is not the scheduler container's port")
        tl = sched_dep["spec"]["template"]["metadata"]["labels"]
        if any(tl.get(a) != b for a, b in ssvc["spec"].get("selector", {}).items()):
            err("scheduler Service", "selector does not select the scheduler pods")
    if not sflags.get("--data") or not under_mount(sflags["--data"], sc):
        err("scheduler", f"--data {sflags.get('--data')} is not on a volume")
    vols = {v["name"]: v for v in sched_dep["spec"]["template"]["spec"].get("volumes", [])}
    dmount = [m for m in sc.get("volumeMounts", []) if sflags.get("--data", "").startswith(
        m["mountPath"])]
    if dmount:
        claim = vols.get(dmount[0]["name"], {}).get("persistentVolumeClaim", {}).get("claimName")
        if not claim or not find(objs, "PersistentVolumeClaim", claim):
            err("scheduler", "its data directory is not on a PersistentVolumeClaim of the job")

    # Servers: headless Service, ports, DNS names.
    sub = sts["spec"]["template"]["spec"].get("subdomain")
    hsvc = one(objs, "Service", data.get("CHAINPS_SERVER_SERVICE"), where="CHAINPS_SERVER_SERVICE")
    if data.get("CHAINPS_SERVER_SERVICE") != sub:
        err("servers' Job", f"pod subdomain {sub} is not CHAINPS_SERVER_SERVICE "
            f"{data.get('CHAINPS_SERVER_SERVICE')} (the pods' DNS names are under it)")
    if hsvc and not selects({"matchLabels": hsvc["spec"].get("selector")}, labels["server"]):
        err("server Service", "selector does not select the server pods")
    vc = sts["spec"]["template"]["spec"]["containers"][0]
    venv = env_of(vc, cms)
    vflags = parse_flags([expand(a, venv) for a in vc.get("args", [])])
    vports = {p.get("name"): p["containerPort"] for p in vc.get("ports", [])}
    if vflags.get("--scheduler") != data.get("CHAINPS_SCHEDULER"):
        err("server", f"--scheduler {vflags.get('--scheduler')} is not the scheduler Service")
    if hsvc:
        if hsvc["spec"].get("clusterIP") != "None":
            err("server Service", "not headless (clusterIP: None)")
        if not hsvc["spec"].get("publishNotReadyAddresses"):
            err("server Service", "publishNotReadyAddresses must be true (a server's name must "
                "resolve before it is ready)")
        p = hsvc["spec"]["ports"][0]
        if str(p["port"]) != str(vflags.get("--port")):
            err("server Service", f"port {p['port']} != server --port {vflags.get('--port')}")
        tp = p.get("targetPort", p["port"])
        if str(vports.get(tp, tp)) != str(vflags.get("--port")):
            err("server Service", f"targetPort {tp} is container port {vports.get(tp, tp)}, "
                f"not the server's --port {vflags.get('--port')}")
    if vflags.get("--bind") != "0.0.0.0":
        err("server", "--bind must be 0.0.0.0 (the pod's IP changes on restart)")
    for f in ("--rank", "--advertise"):
        if f in vflags:
            err("server", f"{f} in args: chainps-k8s sets it from the pod")
    want = {"JOB_NAME": "metadata.labels['batch.kubernetes.io/job-name']",
            "POD_NAMESPACE": "metadata.namespace"}
    for e, path in want.items():
        got = [x for x in vc.get("env", []) if x["name"] == e]
        if not got or got[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != path:
            err("server", f"no {e} from the downward API ({path}) for the advertised name")
    ns = sts["metadata"].get("namespace", "default")
    host = f"{sts['metadata']['name']}-{max(ns_ - 1, 0)}"
    longest = f"{host}.{sub}.{ns}.svc"
    if len(longest) > 112:
        err("server", f"advertised name {longest} longer than chainps's 112 characters")
    if len(host) > 63:
        err("server", f"host name {host} longer than 63 characters")
    if not vflags.get("--data") or not under_mount(vflags["--data"], vc):
        err("server", f"--data {vflags.get('--data')} is not on a volume")
    vvols = {v["name"]: v for v in sts["spec"]["template"]["spec"].get("volumes", [])}
    dm = [m for m in vc.get("volumeMounts", []) if vflags.get("--data", "").startswith(m["mountPath"])]
    if not dm or "volumeClaimTemplate" not in vvols.get(dm[0]["name"], {}).get("ephemeral", {}):
        err("server", "its --data is not on an ephemeral volume claim (one LMDB volume per "
            "server pod, kept across container restarts)")

    # Workers.
    wc = job["spec"]["template"]["spec"]["containers"][0]
    wenv = env_of(wc, cms)
    if job["spec"]["template"]["spec"].get("restartPolicy") not in ("OnFailure", "Never"):
        err("Job", "restartPolicy must be OnFailure or Never")

    # Commands and flags: chainps-k8s ROLE [chainps flags] / worker PROGRAM [flags].
    with open(wrapper) as f:
        wtext = f.read()
    roles = {"scheduler": (sched_dep, sc, sflags), "server": (sts, vc, vflags)}
    # Every worker gets the job's settings from the ConfigMap and its role; chainps-k8s gives
    # it CHAINPS_RANK from JOB_COMPLETION_INDEX (the command's check below).
    for key in ("CHAINPS_SCHEDULER", "CHAINPS_SECRET_FILE", "CHAINPS_SECRET_MOUNT",
                "CHAINPS_NUM_SERVERS", "CHAINPS_NUM_WORKERS", "CHAINPS_MODE"):
        if wenv.get(key) != data.get(key):
            err("worker", f"{key} is {wenv.get(key)!r} in its environment, not the ConfigMap's")
    if wenv.get("CHAINPS_ROLE") != "worker":
        err("worker", "CHAINPS_ROLE is not worker in its environment")
    for role, (obj, c, flags) in roles.items():
        cmd = c.get("command", [])
        if cmd[:2] != ["chainps-k8s", role]:
            err(role, f"command {cmd} is not ['chainps-k8s', '{role}']")
        known = help_flags(chainps, role)
        for fl in flags:
            if fl not in known:
                err(role, f"flag {fl} is not one of `chainps {role} --help`")
        # the flags chainps-k8s itself adds
        for m in re.finditer(r'"\$CHAINPS" ' + role + r'((?: [^|\n]*?)?)(?:\|\||\n)', wtext):
            for fl in re.findall(r"(--[a-z-]+)", m.group(1)):
                if fl not in known:
                    err("chainps-k8s.sh", f"adds {fl}, not one of `chainps {role} --help`")
        if env_of(c, cms).get("CHAINPS_ROLE") != role:
            err(role, f"CHAINPS_ROLE is not {role} in its environment (the probes read it)")
    status_known = help_flags(chainps, "status")
    for m in re.finditer(r'"\$CHAINPS" status([^\n]*)', wtext):
        for fl in re.findall(r"(--[a-z-]+)", m.group(1)):
            if fl not in status_known:
                err("chainps-k8s.sh", f"runs status {fl}, not one of `chainps status --help`")
    wcmd = wc.get("command", [])
    if wcmd[:2] != ["chainps-k8s", "worker"] or len(wcmd) < 3:
        err("worker", f"command {wcmd} is not ['chainps-k8s', 'worker', PROGRAM]")
    elif wcmd[2] == "fmnist":
        wflags = parse_flags([expand(a, wenv) for a in wc.get("args", [])])
        if fmnist:
            known = help_flags(fmnist)
            for fl in wflags:
                if fl not in known:
                    err("worker", f"flag {fl} is not one of `fmnist --help`")
        else:
            print("k8s_check: note: no fmnist binary given; the worker's flags were not checked")
        if "--out" in wflags and not under_mount(wflags["--out"], wc):
            err("worker", f"--out {wflags['--out']} is not on a volume (read-only root)")
        if "--data" in wflags and wflags["--data"] != "/usr/share/datasets/fashion-mnist" and \
                not under_mount(wflags["--data"], wc):
            err("worker", f"--data {wflags['--data']} is neither in the image nor on a volume")
    elif wcmd[2] in ("python3", "/usr/bin/python3"):
        check_torch_worker(root, base, wc, wenv, sc)
    else:
        print(f"k8s_check: note: worker program {wcmd[2]}: its flags were not checked")

    check_pdb(objs, data, labels, ns_)
    check_netpol(objs, labels, root, {"scheduler": sc, "server": vc, "worker": wc})

    # Probes: scheduler and servers, through chainps-k8s probe, generous liveness.
    for role, (obj, c, _) in roles.items():
        for kind, pname in (("ready", "readinessProbe"), ("live", "livenessProbe")):
            p = c.get(pname)
            if not p:
                err(role, f"no {pname}")
                continue
            if p.get("exec", {}).get("command") != ["chainps-k8s", "probe", kind]:
                err(role, f"{pname} does not run chainps-k8s probe {kind}")
            if p.get("timeoutSeconds", 1) <= 3:
                err(role, f"{pname} timeoutSeconds must exceed chainps status's 3 s")
            if kind == "live":
                budget = p.get("periodSeconds", 10) * p.get("failureThreshold", 3)
                if budget < 120:
                    err(role, f"liveness restarts after {budget} s without an answer: give it "
                        "at least 120 s, a slow scheduler is not a dead one")
    for kind in ("ready", "live"):
        if f"{kind})" not in wtext:
            err("chainps-k8s.sh", f"no probe {kind}")

    # The secret: a Secret volume at the directory of CHAINPS_SECRET_MOUNT holding its key,
    # and CHAINPS_SECRET_FILE on a writable in-memory emptyDir.
    smount, sfile = data.get("CHAINPS_SECRET_MOUNT", ""), data.get("CHAINPS_SECRET_FILE", "")
    for w in (sched_dep, sts, job):
        ps = w["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in ps.get("volumes", [])}
        for c in ps["containers"]:
            name = f"{w['kind']} {c['name']}"
            ok = False
            for m in c.get("volumeMounts", []):
                v = vols.get(m["name"], {})
                if "secret" in v and smount == os.path.join(m["mountPath"], os.path.basename(smount)):
                    sec = secrets.get(v["secret"].get("secretName"))
                    if not sec:
                        err(name, f"mounts Secret {v['secret'].get('secretName')}, not rendered")
                    elif os.path.basename(smount) not in sec.get("data", {}):
                        err(name, f"Secret has no key {os.path.basename(smount)}")
                    else:
                        ok = m.get("readOnly", False)
                if m["mountPath"] == os.path.dirname(sfile):
                    if v.get("emptyDir", {}).get("medium") != "Memory":
                        err(name, f"{m['mountPath']} (the secret's copy) is not an in-memory emptyDir")
            if not ok:
                err(name, f"the Secret is not mounted read-only where CHAINPS_SECRET_MOUNT "
                    f"({smount}) points")
            if not under_mount(os.path.dirname(sfile), c):
                err(name, f"CHAINPS_SECRET_FILE's directory {os.path.dirname(sfile)} is not mounted")
            if "--secret-file" in " ".join(c.get("args", [])) or "--insecure" in " ".join(
                    c.get("args", [])):
                err(name, "secret flags in args: the secret comes from CHAINPS_SECRET_FILE")

    # Security and resources of every pod.
    dockerfile = os.path.join(base, "Dockerfile")
    uid = None
    with open(dockerfile) as f:
        for line in f:
            m = re.match(r"USER\s+(\d+)", line)
            if m:
                uid = int(m.group(1))
    for w in (sched_dep, sts, job):
        ps = w["spec"]["template"]["spec"]
        name = w["kind"]
        psc = ps.get("securityContext", {})
        if not psc.get("runAsNonRoot") or psc.get("runAsUser") in (None, 0):
            err(name, "pods must run as a non-root user (runAsNonRoot, runAsUser)")
        if uid is not None and psc.get("runAsUser") != uid:
            err(name, f"runAsUser {psc.get('runAsUser')} != the Dockerfile's USER {uid}")
        if psc.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            err(name, "no seccompProfile RuntimeDefault")
        if ps.get("enableServiceLinks", True):
            err(name, "enableServiceLinks must be false (CHAINPS_SCHEDULER_* service variables)")
        if ps.get("automountServiceAccountToken", True):
            err(name, "automountServiceAccountToken should be false (chainps needs no API)")
        for c in ps["containers"]:
            csc = c.get("securityContext", {})
            if csc.get("allowPrivilegeEscalation") is not False:
                err(name, "allowPrivilegeEscalation must be false")
            if csc.get("readOnlyRootFilesystem") is not True:
                err(name, "readOnlyRootFilesystem must be true")
            if "ALL" not in csc.get("capabilities", {}).get("drop", []):
                err(name, "capabilities must drop ALL")
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in res.get(part, {}):
                        err(name, f"no resources.{part}.{r}")
            if not under_mount("/tmp", c):
                err(name, "/tmp is not mounted (read-only root filesystem)")
            if c.get("image") != sc.get("image") and not (w is job and torch_image(c, sc)):
                err(name, f"image {c.get('image')} differs from the scheduler's {sc.get('image')}")


# The PyTorch example as the image's torch variant installs it (deploy/k8s/Dockerfile,
# WITH_TORCH=1), and where it is in the repository.
TORCH_TRAIN = "/usr/local/share/chainps/examples/torch/train.py"
TORCH_TRAIN_SRC = "examples/torch/train.py"


def torch_image(c, sc):
    """Is C's image the torch variant of the scheduler's (NAME-torch:TAG)?"""
    name, _, tag = sc.get("image", "").partition(":")
    return c.get("image") == f"{name}-torch:{tag}"


def python_with(*modules):
    for p in ("/usr/bin/python3", sys.executable):
        try:
            r = subprocess.run([p, "-c", "import " + ", ".join(modules)], capture_output=True,
                               timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return p
    return None


def check_torch_worker(root, base, wc, wenv, sc):
    """The PyTorch workers: chainps-k8s worker python3 TRAIN.PY [flags], in the torch image,
    with flags train.py knows and its outputs on volumes."""
    cmd = wc.get("command", [])
    if cmd[3:4] != [TORCH_TRAIN]:
        err("worker", f"command {cmd} does not run {TORCH_TRAIN}")
        return
    if not torch_image(wc, sc):
        err("worker", f"image {wc.get('image')} is not the torch variant of {sc.get('image')}")
    with open(os.path.join(base, "Dockerfile")) as f:
        df = f.read()
    if not re.search(r"\b" + re.escape(TORCH_TRAIN_SRC) + r"[\s\\]+\S*" +
                     re.escape(os.path.dirname(TORCH_TRAIN)), df):
        err("Dockerfile", f"does not install {TORCH_TRAIN_SRC} at {TORCH_TRAIN}")
    src = os.path.join(root, TORCH_TRAIN_SRC)
    args = cmd[4:] + [expand(a, wenv) for a in wc.get("args", [])]
    flags = parse_flags(args)
    py = python_with("numpy")
    if py:
        try:
            r = subprocess.run([py, src, "--help"], capture_output=True, text=True, timeout=60)
            known = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", r.stdout + r.stderr))
        except (OSError, subprocess.TimeoutExpired) as e:
            err(src, f"cannot run --help: {e}")
            known = set()
        for fl in flags:
            if fl not in known:
                err("worker", f"flag {fl} is not one of `train.py --help`")
    else:
        print("k8s_check: note: no python3 with numpy: train.py's flags were not checked")
    for fl in ("--save",):
        if flags.get(fl) and not under_mount(flags[fl], wc):
            err("worker", f"{fl} {flags[fl]} is not on a volume (read-only root)")
    if flags.get("--data", "/usr/share/datasets/fashion-mnist") != \
            "/usr/share/datasets/fashion-mnist" and not under_mount(flags["--data"], wc):
        err("worker", f"--data {flags['--data']} is neither in the image nor on a volume")
    for fl in ("--local", "--eval"):
        if fl in flags:
            err("worker", f"{fl}: train.py would not join the job")
    threads = flags.get("--threads") or "1"
    cpu = str(wc.get("resources", {}).get("limits", {}).get("cpu", ""))
    if cpu.isdigit() and int(threads) > int(cpu):
        err("worker", f"--threads {threads} above its CPU limit {cpu}")
    if wenv.get("OMP_NUM_THREADS") != threads:
        err("worker", f"OMP_NUM_THREADS {wenv.get('OMP_NUM_THREADS')} is not --threads {threads}")


def check_pdb(objs, data, labels, nservers):
    """One PodDisruptionBudget, over the servers alone: one server down at a time."""
    pdbs = find(objs, "PodDisruptionBudget")
    mine = [p for p in pdbs if selects(p["spec"].get("selector"), labels["server"])]
    if len(mine) != 1:
        err("PodDisruptionBudget", f"{len(mine)} select the server pods, expected 1")
    for p in pdbs:
        name = f"PodDisruptionBudget {p['metadata']['name']}"
        for comp in ("scheduler", "worker"):
            if selects(p["spec"].get("selector"), labels[comp]):
                err(name, f"selects the {comp} pods: it is for the servers")
        if p not in mine:
            continue
        spec = p["spec"]
        # The servers are a Job's pods: Kubernetes applies only an integer minAvailable to
        # them (maxUnavailable and percentages need a scale subresource).
        if "maxUnavailable" in spec:
            err(name, "maxUnavailable is not applied to a Job's pods: use minAvailable")
        ma = spec.get("minAvailable")
        if not isinstance(ma, int):
            err(name, f"minAvailable {ma!r} must be a whole number (servers - 1)")
        elif ma != nservers - 1:
            err(name, f"minAvailable {ma} != CHAINPS_NUM_SERVERS - 1 = {nservers - 1}: one "
                "server at a time may go, each replacement copying its ranges before the next")


def check_netpol(objs, labels, root, containers):
    """The NetworkPolicies admit only the job's pods, to every port each pod listens on."""
    pols = find(objs, "NetworkPolicy")
    rng = transport_port_range(root)
    for comp, lab in labels.items():
        mine = [p for p in pols if selects(p["spec"].get("podSelector"), lab)]
        if not mine:
            err("NetworkPolicy", f"none selects the {comp} pods: anyone reaches them")
            continue
        need = {p["containerPort"] for p in containers[comp].get("ports", [])}
        allowed = []  # (lo, hi)
        for p in mine:
            name = f"NetworkPolicy {p['metadata']['name']}"
            if "Ingress" not in p["spec"].get("policyTypes", ["Ingress"]):
                err(name, "policyTypes has no Ingress")
            for rule in p["spec"].get("ingress", []):
                peers = rule.get("from")
                if not peers:
                    err(name, "an ingress rule without `from` admits everyone")
                for peer in peers or []:
                    if set(peer) != {"podSelector"}:
                        err(name, f"a peer other than the namespace's pods: {sorted(peer)}")
                        continue
                    sel = peer["podSelector"]
                    if not sel.get("matchLabels"):
                        err(name, "an empty podSelector admits every pod of the namespace")
                        continue
                    for other, olab in labels.items():
                        if not selects(sel, olab):
                            err(name, f"does not admit the {other} pods (job's pods reach "
                                "each other)")
                    if not sel["matchLabels"].keys() & {"app.kubernetes.io/part-of",
                                                        "app.kubernetes.io/name"}:
                        err(name, "its podSelector is not the job's label")
                ports = rule.get("ports")
                if not ports:
                    err(name, "an ingress rule without ports admits every port")
                for port in ports or []:
                    if port.get("protocol", "TCP") != "TCP":
                        continue
                    lo = port.get("port")
                    if not isinstance(lo, int):
                        err(name, f"port {lo!r}: use numbers")
                        continue
                    allowed.append((lo, port.get("endPort", lo)))
        for n in sorted(need):
            if not any(lo <= n <= hi for lo, hi in allowed):
                err(f"NetworkPolicy for {comp}", f"container port {n} is not admitted")
        if rng and not any(lo <= rng[0] and rng[1] <= hi for lo, hi in allowed):
            err(f"NetworkPolicy for {comp}", f"ports {rng[0]}-{rng[1]} (chainps's inboxes "
                "bound to port 0: workers, checkpoint reads, chainps status) are not admitted")
        extra = [(lo, hi) for lo, hi in allowed if not (rng and rng[0] <= lo and hi <= rng[1])
                 and not any(lo <= n <= hi for n in need)]
        for lo, hi in extra:
            err(f"NetworkPolicy for {comp}", f"admits {lo}-{hi}, where no {comp} listens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("deploy")
    ap.add_argument("chainps")
    ap.add_argument("fmnist", nargs="?")
    ap.add_argument("--secret", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", help="the repository (src/, examples/), when DEPLOY_DIR is a copy")
    a = ap.parse_args()
    global ROOT
    ROOT = a.root
    try:
        k, objs = render(a.deploy, a.secret)
        if not errors:
            check(a.deploy, a.chainps, a.fmnist, k, copy.deepcopy(objs))
    except (KeyError, IndexError, TypeError, AttributeError, yaml.YAMLError) as e:
        err("deploy/k8s", f"malformed manifests: {type(e).__name__}: {e}")
        objs = []
    for o in objs:
        o.pop("_file", None)
    with open(a.out, "w") as f:
        json.dump(objs, f, indent=1)
    for e in errors:
        print(f"k8s_check: FAIL: {e}")
    if errors:
        return 1
    kinds = ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
    print(f"k8s_check: {len(objs)} objects rendered and consistent: {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
