#!/usr/bin/env python3
"""Structural check of deploy/k8s against itself and the Rust sources (no cluster needed).

    deploy/k8s/validate.sh     # schema validation, then this (its venv has PyYAML)

Checks: every YAML document parses and has apiVersion/kind/metadata.name; every kustomization
resource exists; selectors (Deployment, StatefulSet, Service, PDB, NetworkPolicy, spread and
anti-affinity) match a pod template's labels (of a Deployment, StatefulSet or Job); Service
targetPorts and probe ports name a container port; every long-running container has
readiness and liveness probes, every container cpu/memory requests and limits, every
Deployment and StatefulSet a PodDisruptionBudget; HPA targets exist; floodgate-secrets
keys exist in secret.yaml and configMap volumes in the generator or a ConfigMap here; every
environment variable and every floodgate.toml key is one the Rust config of that process
reads; terminationGracePeriodSeconds covers preStop sleep + the gateway's grace_period_s.
Full schema validation is validate.sh's (it renders the kustomization and runs
kubernetes-validate in strict mode), which runs this afterwards.
"""

import re
import sys
import tomllib
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
errors: list[str] = []


def err(msg: str) -> None:
    errors.append(msg)


def struct_fields(path: str, name: str) -> set[str]:
    """`pub field:` names of a Rust struct (good enough for the plain config structs)."""
    text = (ROOT / path).read_text()
    m = re.search(r"pub struct " + name + r"\s*\{(.*?)\n\}", text, re.S)
    if not m:
        err(f"struct {name} not found in {path}")
        return set()
    return set(re.findall(r"^\s*pub (\w+):", m.group(1), re.M))


SHARED = "shared/src/config.rs"  # the loader (env aliases)
SHARED_SECTIONS = "shared/src/config/sections.rs"  # the settings structs
SECTIONS = {  # [section] -> the struct that deserializes it
    "log": (SHARED_SECTIONS, "LogSettings"),
    "tokens": (SHARED_SECTIONS, "TokenSettings"),
    "identity": (SHARED_SECTIONS, "IdentitySettings"),
    "redis": (SHARED_SECTIONS, "RedisSettings"),
    "database": (SHARED_SECTIONS, "DatabaseSettings"),
    "gateway": ("gateway/src/config.rs", "GatewaySettings"),
    "booking": ("booking/src/app/config.rs", "BookingSettings"),
    "payments": ("booking/src/payments.rs", "PaymentSettings"),
    "tickets": ("booking/src/tickets.rs", "TicketSettings"),
    "mail": ("booking/src/tickets/mail/settings.rs", "MailSettings"),
}
PROCESSES = {  # container name -> its top-level config struct
    "gateway": struct_fields("gateway/src/config.rs", "GatewayConfig"),
    "booking": struct_fields("booking/src/app/config.rs", "BookingConfig"),
}
# Names the loader maps specially (shared/src/config.rs), checked against its source text.
ALIASES = {
    "FLOODGATE_ADMIN_TOKEN": ("admin_token",),
    "DATABASE_URL": ("database", "url"),
    "REDIS_URL": ("redis", "url"),
}
config_rs = (ROOT / SHARED).read_text()
for name in [*ALIASES, "FLOODGATE_CONFIG"]:
    if f'"{name}"' not in config_rs:
        err(f"{SHARED} no longer reads {name}")


def config_path(env: str) -> tuple[str, ...] | None:
    if env in ALIASES:
        return ALIASES[env]
    if env.startswith("FLOODGATE_"):
        return tuple(p.lower() for p in env[len("FLOODGATE_"):].split("__"))
    return None


def check_key(process: str, path: tuple[str, ...], what: str) -> None:
    if path[0] not in PROCESSES[process]:
        err(f"{what}: {process} does not read [{path[0]}]")
        return
    if len(path) == 1:
        return
    if path[0] not in SECTIONS:
        err(f"{what}: no struct known for [{path[0]}] (extend SECTIONS)")
        return
    if path[1] not in struct_fields(*SECTIONS[path[0]]):
        err(f"{what}: [{path[0]}] has no key {path[1]!r}")


# --- YAML ---------------------------------------------------------------------------------
kust = yaml.safe_load((HERE / "kustomization.yaml").read_text())
docs = []
for f in sorted(HERE.glob("*.yaml")):
    if f.name == "kustomization.yaml":
        continue
    for d in yaml.safe_load_all(f.read_text()):
        if d is None:
            continue
        name = (d.get("metadata") or {}).get("name")
        if not (d.get("apiVersion") and d.get("kind") and name):
            err(f"{f.name}: a document lacks apiVersion/kind/metadata.name")
        docs.append((f.name, d))
for r in kust["resources"]:
    if not (HERE / r).exists():
        err(f"kustomization: missing resource {r}")
listed = set(kust["resources"])
for f in HERE.glob("*.yaml"):
    # redis-cluster.yaml is optional (a managed Redis Cluster replaces it); still checked.
    if f.name not in listed | {"kustomization.yaml", "secret.yaml", "redis-cluster.yaml"}:
        err(f"{f.name} is not listed in kustomization.yaml")

by_kind: dict[str, dict[str, dict]] = {}
for _, d in docs:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
secret = by_kind["Secret"]["floodgate-secrets"]["stringData"]
generated = {g["name"] for g in kust.get("configMapGenerator", [])}
config_maps = generated | set(by_kind.get("ConfigMap", {}))
for key, value in secret.items():
    if value.startswith("["):  # the loader parses these as a TOML value (`v = <value>`)
        try:
            tomllib.loads(f"v = {value}")
        except tomllib.TOMLDecodeError as e:
            err(f"secret.yaml: {key} is not a TOML array: {e}")
config = tomllib.loads((HERE / "floodgate.toml").read_text())
deployments = by_kind.get("Deployment", {})
# Everything with a pod template, for selectors; Jobs generate their own selector.
workloads = {n: d for kind in ("Deployment", "StatefulSet", "Job")
             for n, d in by_kind.get(kind, {}).items()}


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pods_selected(selector: dict) -> list[str]:
    return [n for n, d in workloads.items()
            if matches(selector, d["spec"]["template"]["metadata"]["labels"])]


for name, d in workloads.items():
    spec = d["spec"]
    labels = spec["template"]["metadata"]["labels"]
    if d["kind"] != "Job" and not matches(spec["selector"]["matchLabels"], labels):
        err(f"{d['kind']} {name}: selector does not match the pod template labels")
    pod = spec["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    for v in volumes.values():
        if "configMap" in v and v["configMap"]["name"] not in config_maps:
            err(f"{d['kind']} {name}: unknown ConfigMap {v['configMap']['name']}")
    for c in pod["containers"]:
        ports = {p["name"] for p in c.get("ports", [])}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("httpGet", {}).get("port")
            if port is not None and port not in ports:
                err(f"{d['kind']} {name}: {probe} port {port!r} is not a container port")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes and m["name"] not in claims:
                err(f"{d['kind']} {name}: mount of unknown volume {m['name']}")
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["name"] == "floodgate-secrets" and ref["key"] not in secret:
                err(f"{d['kind']} {name}: Secret key {ref['key']} missing from secret.yaml")
            path = config_path(e["name"])
            if path is not None and e["name"] != "FLOODGATE_CONFIG":
                check_key(c["name"], path, f"{name} env {e['name']}")
        if d["kind"] != "Job" and not ("readinessProbe" in c and "livenessProbe" in c):
            err(f"{d['kind']} {name}: container {c['name']} lacks a readiness or liveness probe")
        res = c.get("resources", {})
        if not all(r in res.get(k, {}) for k in ("requests", "limits") for r in ("cpu", "memory")):
            err(f"{d['kind']} {name}: container {c['name']} lacks cpu/memory requests and limits")
        sc = c.get("securityContext", {})
        if not sc.get("readOnlyRootFilesystem") or not pod["securityContext"].get("runAsNonRoot"):
            err(f"{d['kind']} {name}: not read-only / non-root")
        stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        sleep = int(stop[1]) if stop[:1] == ["sleep"] else 0
        drain = config["gateway"].get("grace_period_s", 5) + 1 if c["name"] == "gateway" else 0
        if pod.get("terminationGracePeriodSeconds", 30) < sleep + drain:
            err(f"{d['kind']} {name}: terminationGracePeriodSeconds < preStop + drain")
    for ts in pod.get("topologySpreadConstraints", []):
        if not matches(ts["labelSelector"]["matchLabels"], labels):
            err(f"{d['kind']} {name}: topology spread selector does not match its pods")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {})
    for term in (anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
                 + [p["podAffinityTerm"] for p in
                    anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]):
        if not matches(term["labelSelector"]["matchLabels"], labels):
            err(f"{d['kind']} {name}: pod anti-affinity selector does not match its pods")

for name, s in by_kind.get("Service", {}).items():
    targets = pods_selected(s["spec"]["selector"])
    if len(targets) != 1:
        err(f"Service {name}: selects {targets}, expected one workload")
        continue
    cports = {p["name"] for c in workloads[targets[0]]["spec"]["template"]["spec"]["containers"]
              for p in c.get("ports", [])}
    for p in s["spec"]["ports"]:
        if p["targetPort"] not in cports:
            err(f"Service {name}: targetPort {p['targetPort']!r} not in {sorted(cports)}")

for kind in ("PodDisruptionBudget", "NetworkPolicy"):
    for name, d in by_kind.get(kind, {}).items():
        sel = d["spec"].get("selector") or d["spec"].get("podSelector")
        if len(pods_selected(sel["matchLabels"])) != 1:
            err(f"{kind} {name}: selector matches no single workload")
for name, np in by_kind.get("NetworkPolicy", {}).items():
    for rule in np["spec"].get("ingress", []):
        for peer in rule.get("from", []):
            if "podSelector" in peer and not pods_selected(peer["podSelector"]["matchLabels"]):
                err(f"NetworkPolicy {name}: a source selector matches no pods")
guarded = {n for p in by_kind.get("PodDisruptionBudget", {}).values()
           for n in pods_selected(p["spec"]["selector"]["matchLabels"])}
for name, d in workloads.items():
    if d["kind"] != "Job" and name not in guarded:
        err(f"{d['kind']} {name}: no PodDisruptionBudget")
for name, h in by_kind.get("HorizontalPodAutoscaler", {}).items():
    ref = h["spec"]["scaleTargetRef"]
    if ref["kind"] != "Deployment" or ref["name"] not in deployments:
        err(f"HPA {name}: target {ref} does not exist")
    if "replicas" in deployments.get(ref["name"], {}).get("spec", {}):
        err(f"HPA {name}: its Deployment sets replicas (apply would fight the HPA)")

# --- floodgate.toml -----------------------------------------------------------------------
for section, table in config.items():
    readers = [p for p, fields in PROCESSES.items() if section in fields]
    if not readers:
        err(f"floodgate.toml: no process reads [{section}]")
    for key in table:
        check_key(readers[0] if readers else "gateway", (section, key), "floodgate.toml")
upstreams = config["gateway"]["upstreams"]
booking_port = by_kind["Service"]["booking"]["spec"]["ports"][0]["port"]
if upstreams != [f"booking:{booking_port}"]:
    err(f"floodgate.toml: gateway.upstreams {upstreams} is not the booking Service")

if errors:
    print("\n".join(f"FAIL {e}" for e in errors))
    sys.exit(1)
print(f"ok: {len(docs)} documents, {len(deployments)} Deployments, "
      f"{len(by_kind.get('Service', {}))} Services, env and config keys match the Rust sources")
