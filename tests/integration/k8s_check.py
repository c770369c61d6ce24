#!/usr/bin/env python3
"""Render deploy/k8s/ as `kubectl apply -k` would and check what the schema cannot.

usage: k8s_check.py DEPLOY_DIR CHAINPS_BIN [FMNIST_BIN] --secret FILE --out OBJECTS.json

Renders the kustomization (resources, namespace, secretGenerator from FILE, generatorOptions,
images: the features it uses; anything else in it is refused), writes the objects as a JSON
list to OBJECTS.json for the schema validator, and checks chainps's own invariants:
every flag a container passes exists in `chainps ROLE --help` (or `fmnist --help`), the
ports agree between the Services, the arguments, the ConfigMap and the containers, the
secret is mounted where the ConfigMap points, counts agree, labels select what they should,
probes are there with generous liveness thresholds, and the pods run non-root with a
read-only root filesystem. Every failure is printed; exit 1 if any, 0 otherwise.
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
                  "generatorOptions", "images"}


def render(deploy, secret_file):
    kpath = os.path.join(deploy, "kustomization.yaml")
    with open(kpath) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - KUSTOMIZE_KEYS
    if unknown:
        err(kpath, f"fields this check does not render: {sorted(unknown)}")
    if k.get("kind") != "Kustomization":
        err(kpath, "kind is not Kustomization")
    listed = k.get("resources", [])
    on_disk = sorted(f for f in os.listdir(deploy) if f.endswith((".yaml", ".yml"))
                     and f != "kustomization.yaml")
    for f in on_disk:
        if f not in listed:
            err(kpath, f"{f} is in deploy/k8s but not in resources")
    objs = []
    for r in listed:
        p = os.path.join(deploy, r)
        if not os.path.isfile(p):
            err(kpath, f"resource {r} does not exist")
            continue
        for d in load_yaml_docs(p):
            d["_file"] = r
            objs.append(d)
    opts = k.get("generatorOptions", {})
    for g in k.get("secretGenerator", []):
        data = {}
        for spec in g.get("files", []):
            key, _, src = spec.partition("=")
            src = src or key
            key = os.path.basename(key)
            if not os.path.isfile(os.path.join(deploy, src)):
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
    for o in objs:
        for c in containers_of(o):
            name, _, tag = c.get("image", "").partition(":")
            if name in images:
                c["image"] = images[name].get("newName", name) + ":" + images[name].get(
                    "newTag", tag)
            elif images:
                err(o["_file"], f"image {c.get('image')} is not under the kustomization's images")
    if ns and not any(o["kind"] == "Namespace" and o["metadata"]["name"] == ns for o in objs):
        err(kpath, f"namespace {ns} has no Namespace object")
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


def check(deploy, chainps, fmnist, k, objs):
    where = "deploy/k8s"
    cms = {o["metadata"]["name"]: o for o in find(objs, "ConfigMap")}
    secrets = {o["metadata"]["name"]: o for o in find(objs, "Secret")}
    cfg = one(objs, "ConfigMap", where=where)
    sched_dep = one(objs, "Deployment", where=where)
    sts = one(objs, "StatefulSet", where=where)
    job = one(objs, "Job", where=where)
    if not (cfg and sched_dep and sts and job):
        return
    data = cfg.get("data", {})
    wrapper = os.path.join(deploy, "chainps-k8s.sh")

    # Labels: every object carries the app's; selectors match their pod templates.
    for o in objs:
        lab = o.get("metadata", {}).get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/part-of"):
            if key not in lab:
                err(f"{o['_file']} {o['kind']} {o['metadata'].get('name')}", f"no label {key}")
    for w in (sched_dep, sts):
        sel = w["spec"].get("selector", {}).get("matchLabels", {})
        tl = w["spec"]["template"].get("metadata", {}).get("labels", {})
        if not sel or any(tl.get(a) != b for a, b in sel.items()):
            err(w["metadata"]["name"], "selector does not match the pod template's labels")

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
    if sts["spec"].get("replicas") != ns_:
        err("StatefulSet", f"replicas {sts['spec'].get('replicas')} != CHAINPS_NUM_SERVERS {ns_}")
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
    if sched_dep["spec"].get("replicas") != 1:
        err("Deployment", "the scheduler must have exactly 1 replica")
    if sched_dep["spec"].get("strategy", {}).get("type") != "Recreate":
        err("Deployment", "the scheduler's strategy must be Recreate (one pod on its volume)")
    if sts["spec"].get("podManagementPolicy") != "Parallel":
        err("StatefulSet", "podManagementPolicy must be Parallel: a server is ready only once "
            "every server has joined")

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
    hsvc = one(objs, "Service", sts["spec"].get("serviceName"), where="StatefulSet serviceName")
    if data.get("CHAINPS_SERVER_SERVICE") != sts["spec"].get("serviceName"):
        err("ConfigMap", "CHAINPS_SERVER_SERVICE is not the StatefulSet's serviceName")
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
    for e in ("POD_NAME", "POD_NAMESPACE"):
        if e not in venv:
            err("server", f"no {e} (downward API) for the advertised name")
    ns = sts["metadata"].get("namespace", "default")
    longest = f"{sts['metadata']['name']}-{max(ns_ - 1, 0)}.{sts['spec'].get('serviceName')}.{ns}.svc"
    if len(longest) > 112:
        err("server", f"advertised name {longest} longer than chainps's 112 characters")
    if not vflags.get("--data") or not under_mount(vflags["--data"], vc):
        err("server", f"--data {vflags.get('--data')} is not on a volume")
    tmpl = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    dm = [m for m in vc.get("volumeMounts", []) if vflags.get("--data", "").startswith(m["mountPath"])]
    if not dm or dm[0]["name"] not in tmpl:
        err("server", "its --data is not on a volumeClaimTemplate (one LMDB volume per server)")

    # Workers.
    wc = job["spec"]["template"]["spec"]["containers"][0]
    wenv = env_of(wc, cms)
    if job["spec"]["template"]["spec"].get("restartPolicy") not in ("OnFailure", "Never"):
        err("Job", "restartPolicy must be OnFailure or Never")

    # Commands and flags: chainps-k8s ROLE [chainps flags] / worker PROGRAM [flags].
    with open(wrapper) as f:
        wtext = f.read()
    roles = {"scheduler": (sched_dep, sc, sflags), "server": (sts, vc, vflags)}
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
    dockerfile = os.path.join(deploy, "Dockerfile")
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
            if c.get("image") != sc.get("image"):
                err(name, f"image {c.get('image')} differs from the scheduler's {sc.get('image')}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("deploy")
    ap.add_argument("chainps")
    ap.add_argument("fmnist", nargs="?")
    ap.add_argument("--secret", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
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
