#!/usr/bin/env python3
"""Structural check of deploy/k8s against itself and the Rust sources (no cluster needed).

    python3 -m venv /tmp/yv && /tmp/yv/bin/pip install pyyaml
    /tmp/yv/bin/python deploy/k8s/check.py

Checks: every YAML document parses and has apiVersion/kind/metadata.name; every kustomization
resource exists; selectors (Deployment, Service, PDB, NetworkPolicy) match a pod template's
labels; Service targetPorts and probe ports name a container port; HPA targets exist;
secretKeyRef keys exist in secret.yaml and configMap volumes in the generator; every
environment variable and every floodgate.toml key is one the Rust config of that process
reads; terminationGracePeriodSeconds covers preStop sleep + the gateway's grace_period_s.
Full schema validation is separate (e.g. `kubernetes-validate --strict` on
`kubectl kustomize deploy/k8s`).
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


SHARED = "shared/src/config.rs"
SECTIONS = {  # [section] -> the struct that deserializes it
    "log": (SHARED, "LogSettings"),
    "tokens": (SHARED, "TokenSettings"),
    "identity": (SHARED, "IdentitySettings"),
    "redis": (SHARED, "RedisSettings"),
    "database": (SHARED, "DatabaseSettings"),
    "gateway": ("gateway/src/config.rs", "GatewaySettings"),
    "booking": ("booking/src/app/config.rs", "BookingSettings"),
    "payments": ("booking/src/payments.rs", "PaymentSettings"),
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
    if f.name not in listed | {"kustomization.yaml", "secret.yaml"}:
        err(f"{f.name} is not listed in kustomization.yaml")

by_kind: dict[str, dict[str, dict]] = {}
for _, d in docs:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
secret = by_kind["Secret"]["floodgate-secrets"]["stringData"]
generated = {g["name"] for g in kust.get("configMapGenerator", [])}
for key, value in secret.items():
    if value.startswith("["):  # the loader parses these as a TOML value (`v = <value>`)
        try:
            tomllib.loads(f"v = {value}")
        except tomllib.TOMLDecodeError as e:
            err(f"secret.yaml: {key} is not a TOML array: {e}")
config = tomllib.loads((HERE / "floodgate.toml").read_text())
deployments = by_kind.get("Deployment", {})


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pods_selected(selector: dict) -> list[str]:
    return [n for n, d in deployments.items()
            if matches(selector, d["spec"]["template"]["metadata"]["labels"])]


for name, d in deployments.items():
    spec = d["spec"]
    labels = spec["template"]["metadata"]["labels"]
    if not matches(spec["selector"]["matchLabels"], labels):
        err(f"Deployment {name}: selector does not match the pod template labels")
    pod = spec["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        if "configMap" in v and v["configMap"]["name"] not in generated:
            err(f"Deployment {name}: unknown ConfigMap {v['configMap']['name']}")
    for c in pod["containers"]:
        ports = {p["name"] for p in c.get("ports", [])}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("httpGet", {}).get("port")
            if port is not None and port not in ports:
                err(f"Deployment {name}: {probe} port {port!r} is not a container port")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                err(f"Deployment {name}: mount of unknown volume {m['name']}")
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["key"] not in secret:
                err(f"Deployment {name}: Secret key {ref['key']} missing from secret.yaml")
            path = config_path(e["name"])
            if path is not None and e["name"] != "FLOODGATE_CONFIG":
                check_key(c["name"], path, f"{name} env {e['name']}")
        sc = c.get("securityContext", {})
        if not sc.get("readOnlyRootFilesystem") or not pod["securityContext"].get("runAsNonRoot"):
            err(f"Deployment {name}: not read-only / non-root")
        stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        sleep = int(stop[1]) if stop[:1] == ["sleep"] else 0
        drain = config["gateway"].get("grace_period_s", 5) + 1 if c["name"] == "gateway" else 0
        if pod.get("terminationGracePeriodSeconds", 30) < sleep + drain:
            err(f"Deployment {name}: terminationGracePeriodSeconds < preStop + drain")
    for ts in pod.get("topologySpreadConstraints", []):
        if not matches(ts["labelSelector"]["matchLabels"], labels):
            err(f"Deployment {name}: topology spread selector does not match its pods")

for name, s in by_kind.get("Service", {}).items():
    targets = pods_selected(s["spec"]["selector"])
    if len(targets) != 1:
        err(f"Service {name}: selects {targets}, expected one Deployment")
        continue
    cports = {p["name"] for c in deployments[targets[0]]["spec"]["template"]["spec"]["containers"]
              for p in c.get("ports", [])}
    for p in s["spec"]["ports"]:
        if p["targetPort"] not in cports:
            err(f"Service {name}: targetPort {p['targetPort']!r} not in {sorted(cports)}")

for kind in ("PodDisruptionBudget", "NetworkPolicy"):
    for name, d in by_kind.get(kind, {}).items():
        sel = d["spec"].get("selector") or d["spec"].get("podSelector")
        if len(pods_selected(sel["matchLabels"])) != 1:
            err(f"{kind} {name}: selector matches no single Deployment")
for name, np in by_kind.get("NetworkPolicy", {}).items():
    for rule in np["spec"].get("ingress", []):
        for peer in rule.get("from", []):
            if "podSelector" in peer and not pods_selected(peer["podSelector"]["matchLabels"]):
                err(f"NetworkPolicy {name}: a source selector matches no pods")
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
