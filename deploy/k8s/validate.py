#!/usr/bin/env python3
"""Schema validation of deploy/k8s, offline. Run it through validate.sh (pinned venv).

1. Renders the kustomization as `kubectl kustomize` does, in Python (kubectl is not needed):
   the resources, `namespace` set on every namespaced object, the configMapGenerator's
   ConfigMap named with kustomize's content-hash suffix and every reference to it rewritten,
   `images` applied. Anything else in kustomization.yaml is refused rather than ignored, so
   the rendering can never silently differ from what `kubectl apply -k` sends. Where kubectl
   is installed, its own rendering must be identical (a cross-check of this renderer).
2. Validates every rendered document with kubernetes-validate in strict mode (an unknown field
   is an error) against each version in K8S_VERSIONS; a kind/apiVersion that has no schema
   in a version (a typo, or an API removed there) is an error too, not the CLI's warning.
3. Runs check.py (selectors, ports, Secret keys, config keys against the Rust sources).

`--self-test` then copies the directory, breaks it in one way at a time and expects each
copy to be rejected, by the step and for the reason the case names.
"""

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kubernetes_validate
import yaml
from kubernetes_validate import utils as kv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# The oldest minor we deploy to, and the newest the pinned kubernetes-validate bundles
# (requirements.txt). Raise the floor when the oldest supported cluster moves.
K8S_VERSIONS = ("1.33", "1.37")

# Kinds that `namespace:` does not apply to (the cluster-scoped ones a kustomization may hold).
CLUSTER_SCOPED = {
    "APIService", "ClusterRole", "ClusterRoleBinding", "CSIDriver", "CustomResourceDefinition",
    "IngressClass", "MutatingWebhookConfiguration", "Namespace", "PersistentVolume",
    "PriorityClass", "RuntimeClass", "StorageClass", "ValidatingWebhookConfiguration",
}
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator",
                      "images"}
GENERATOR_KEYS = {"name", "files", "literals", "options"}
GENERATOR_OPTIONS = {"labels", "annotations", "disableNameSuffixHash"}


class RenderError(Exception):
    pass


# --- rendering ---------------------------------------------------------------------------------
def kustomize_hash(data: dict[str, str]) -> str:
    """kustomize's ConfigMap name suffix (api/hasher): sha256 of the Go-json-encoded
    {data, kind, name} (keys sorted, HTML-escaped as Go's json.Marshal does), its first ten
    hex digits with 0, 1, 3, a, e replaced so the suffix never reads as a number or a word.
    kustomize looks the name up with a path ("metadata/name") that finds nothing, so the name
    it hashes is always empty; the cross-check with kubectl keeps this honest."""
    encoded = json.dumps({"data": data, "kind": "ConfigMap", "name": ""},
                         sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for raw, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                     ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        encoded = encoded.replace(raw, esc)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def pod_specs(doc: dict) -> list[dict]:
    spec = doc.get("spec") or {}
    kind = doc.get("kind")
    if kind == "Pod":
        return [spec]
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec") or {})
    elif kind not in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job",
                      "ReplicationController"}:
        return []
    template = (spec.get("template") or {}).get("spec")
    return [template] if template else []


def containers(pod: dict) -> list[dict]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers")
            for c in pod.get(key) or []]


def rename_config_maps(doc: dict, names: dict[str, str]) -> None:
    def swap(ref: dict | None) -> None:
        if ref and ref.get("name") in names:
            ref["name"] = names[ref["name"]]

    for pod in pod_specs(doc):
        for v in pod.get("volumes") or []:
            swap(v.get("configMap"))
            for source in (v.get("projected") or {}).get("sources") or []:
                swap(source.get("configMap"))
        for c in containers(pod):
            for e in c.get("env") or []:
                swap((e.get("valueFrom") or {}).get("configMapKeyRef"))
            for e in c.get("envFrom") or []:
                swap(e.get("configMapRef"))


def split_image(image: str) -> tuple[str, str, str]:
    """(name, ":tag" or "", "@digest" or "") of an image reference."""
    name, _, digest = image.partition("@")
    tag = ""
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:  # a colon before the last slash is a registry port
        name, tag = name[:colon], name[colon:]
    return name, tag, "@" + digest if digest else ""


def set_images(doc: dict, images: list[dict]) -> None:
    for pod in pod_specs(doc):
        for c in containers(pod):
            name, tag, digest = split_image(c.get("image", ""))
            for img in images:
                if img["name"] != name:
                    continue
                new = img.get("newName", name)
                if "digest" in img:
                    c["image"] = f"{new}@{img['digest']}"
                elif "newTag" in img:
                    c["image"] = f"{new}:{img['newTag']}"
                else:
                    c["image"] = new + tag + digest
                break


def load_docs(path: Path) -> list[dict]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        raise RenderError(f"{path.name}: not valid YAML: {e}") from e
    for d in docs:
        if not isinstance(d, dict):
            raise RenderError(f"{path.name}: a document is not a mapping")
    return docs


def render(kdir: Path) -> list[tuple[str, dict]]:
    """(origin file, document) for every object `kubectl kustomize kdir` would print."""
    kfile = kdir / "kustomization.yaml"
    kust = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(kust) - KUSTOMIZATION_KEYS
    if unknown:
        raise RenderError(f"kustomization.yaml uses {sorted(unknown)}, which validate.py does "
                          f"not implement: extend render() (and compare with kubectl kustomize)")
    out: list[tuple[str, dict]] = []
    for r in kust.get("resources") or []:
        path = kdir / r
        if "://" in r or not path.is_file():
            raise RenderError(f"kustomization.yaml: resource {r} is not a file in {kdir.name}/")
        out += [(r, d) for d in load_docs(path)]

    renamed: dict[str, str] = {}
    for g in kust.get("configMapGenerator") or []:
        if set(g) - GENERATOR_KEYS or set(g.get("options") or {}) - GENERATOR_OPTIONS:
            raise RenderError(f"configMapGenerator {g.get('name')}: only name, files, literals "
                              f"and options {sorted(GENERATOR_OPTIONS)} are implemented")
        data: dict[str, str] = {}
        for f in g.get("files") or []:
            key, _, file = f.rpartition("=") if "=" in f else (Path(f).name, "", f)
            if not (kdir / file).is_file():
                raise RenderError(f"configMapGenerator {g['name']}: no file {file}")
            data[key] = (kdir / file).read_text()
        for lit in g.get("literals") or []:
            key, _, value = lit.partition("=")
            data[key] = value
        opts = g.get("options") or {}
        name = g["name"]
        if not opts.get("disableNameSuffixHash"):
            name = f"{name}-{kustomize_hash(data)}"
            renamed[g["name"]] = name
        meta: dict = {"name": name}
        for field in ("labels", "annotations"):
            if opts.get(field):
                meta[field] = dict(opts[field])
        out.append(("kustomization.yaml", {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": meta, "data": data}))

    for _, d in out:
        if kust.get("namespace") and d.get("kind") not in CLUSTER_SCOPED:
            d.setdefault("metadata", {})["namespace"] = kust["namespace"]
        rename_config_maps(d, renamed)
        set_images(d, kust.get("images") or [])
    return out


def key(d: dict) -> tuple[str, str, str]:
    meta = d.get("metadata") or {}
    return d.get("kind", "?"), meta.get("namespace", ""), meta.get("name", "?")


def first_difference(a, b, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k} only in {'kubectl' if k in b else 'validate.py'}"
            if a[k] != b[k]:
                return first_difference(a[k], b[k], f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or '.'}: validate.py {a!r:.80} != kubectl {b!r:.80}"


def cross_check_kubectl(kdir: Path, rendered: list[tuple[str, dict]]) -> tuple[list[str], str]:
    """Errors, and a note for the summary. Skipped (with a note) when kubectl is absent."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return [], "kubectl not installed: the Python rendering was not cross-checked"
    try:
        run = subprocess.run([kubectl, "kustomize", str(kdir)], capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ["kubectl kustomize did not finish in 120 s (K8S_NO_KUBECTL=1 skips it)"], ""
    if run.returncode != 0:
        return [f"kubectl kustomize failed: {run.stderr.strip()}"], ""
    theirs = {key(d): d for d in yaml.safe_load_all(run.stdout) if d}
    ours = {key(d): d for _, d in rendered}
    errors = [f"kubectl kustomize: {'/'.join(k)} only in "
              f"{'kubectl' if k in theirs else 'validate.py'}'s rendering"
              for k in sorted(set(ours) ^ set(theirs))]
    for k in sorted(set(ours) & set(theirs)):
        if ours[k] != theirs[k]:
            errors.append(f"kubectl kustomize renders {'/'.join(k)} differently: "
                          + first_difference(ours[k], theirs[k]))
    return errors, "identical to `kubectl kustomize`"


# --- schemas -----------------------------------------------------------------------------------
def validate_schemas(rendered: list[tuple[str, dict]], versions: tuple[str, ...]) -> list[str]:
    errors = []
    for origin, d in rendered:
        what = f"{origin}: {d.get('kind')}/{(d.get('metadata') or {}).get('name')}"
        if not (d.get("apiVersion") and d.get("kind")):
            errors.append(f"{what}: no apiVersion/kind")
            continue
        for v in versions:
            try:
                if kv.validate(d, v, strict=True) != v:  # it falls back to an older schema
                    errors.append(f"kubernetes-validate has no Kubernetes {v} schemas")
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in e.path) or "(top)"
                errors.append(f"{what} against Kubernetes {v}: {path}: {e.message}")
            except kv.SchemaNotFoundError:
                errors.append(f"{what}: Kubernetes {v} has no schema for {d['kind']} in "
                              f"{d['apiVersion']} (a typo, or an API that version removed)")
    return errors


def run_check_py(kdir: Path) -> tuple[list[str], str]:
    run = subprocess.run([sys.executable, str(kdir / "check.py")], capture_output=True,
                         text=True)
    out = (run.stdout + run.stderr).strip()
    if run.returncode != 0:
        return ([f"check.py: {line.removeprefix('FAIL ')}" for line in out.splitlines()]
                or ["check.py failed"]), ""
    return [], f"check.py: {out.removeprefix('ok: ')}"


def validate(kdir: Path, use_kubectl: bool) -> tuple[list[str], list[str]]:
    """(errors, summary lines) for the directory."""
    try:
        rendered = render(kdir)
    except (RenderError, OSError, yaml.YAMLError) as e:
        return [f"render: {e}"], []
    errors, notes = [], [f"rendered {len(rendered)} documents from {kdir}/kustomization.yaml"]
    if use_kubectl:
        errs, note = cross_check_kubectl(kdir, copy.deepcopy(rendered))
        errors += errs
        notes.append(f"rendering: {note}" if note else "")
    errs = validate_schemas(rendered, K8S_VERSIONS)
    errors += errs
    if not errs:
        notes.append(f"schemas: every document valid against Kubernetes "
                     f"{' and '.join(K8S_VERSIONS)}, strict (kubernetes-validate "
                     f"{kubernetes_validate.__version__})")
    errs, note = run_check_py(kdir)
    errors += errs
    notes.append(note)
    return errors, [n for n in notes if n]


# --- self-test ---------------------------------------------------------------------------------
# (name, file, text to find, replacement, a phrase the rejection must contain)
BREAKAGES = [
    ("an unknown field (strict mode)", "booking.yaml",
     "  revisionHistoryLimit: 5\n", "  revisionHistoryLimit: 5\n  replica: 3\n",
     "'replica' was unexpected"),
    ("a field of the wrong type", "gateway-hpa.yaml",
     "maxReplicas: 40", 'maxReplicas: "forty"', "maxReplicas"),
    ("a missing required field", "booking.yaml",
     "    - name: http\n      port: 8090\n", "    - name: http\n", "'port' is a required"),
    ("an apiVersion with no schema", "networkpolicy.yaml",
     "apiVersion: networking.k8s.io/v1\n", "apiVersion: networking.k8s.io/v1beta1\n",
     "has no schema for NetworkPolicy"),
    ("a misspelt probe field in the Redis StatefulSet", "redis-cluster.yaml",
     "readinessProbe:", "readynessProbe:", "'readynessProbe' was unexpected"),
    ("a container without limits (check.py)", "booking.yaml",
     '            limits:\n              cpu: "2"\n              memory: 1Gi\n', "",
     "booking lacks cpu/memory requests and limits"),
    ("a StatefulSet no PodDisruptionBudget covers (check.py)", "redis-cluster.yaml",
     "  maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: floodgate\n"
     "      app.kubernetes.io/component: redis-cluster\n",
     "  maxUnavailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: floodgate\n"
     "      app.kubernetes.io/component: redis\n",
     "StatefulSet redis-cluster: no PodDisruptionBudget"),
    ("a Service port naming no container port (check.py)", "gateway.yaml",
     "targetPort: public", "targetPort: publik", "'publik'"),
    ("a resource file that does not exist", "kustomization.yaml",
     "  - namespace.yaml\n", "  - namespace.yaml\n  - nowhere.yaml\n", "nowhere.yaml"),
    ("a kustomize feature the renderer does not implement", "kustomization.yaml",
     "namespace: floodgate\n", "namespace: floodgate\ncommonLabels:\n  team: x\n",
     "does not implement"),
]


def self_test() -> list[str]:
    """Errors (empty: every breakage was caught, and the unbroken copy passed)."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="k8s-selftest-") as tmp:
        root = Path(tmp)
        for src in ("shared", "gateway", "booking"):  # check.py reads the Rust config structs
            (root / src).symlink_to(ROOT / src)
        pristine = root / "pristine"
        shutil.copytree(HERE, pristine, ignore=shutil.ignore_patterns("__pycache__"))
        for i, (name, file, old, new, expect) in enumerate([("the unbroken copy", "", "", "", "")]
                                                          + BREAKAGES):
            kdir = root / "deploy" / f"k8s-{i}"
            shutil.copytree(pristine, kdir)
            if file:
                text = (kdir / file).read_text()
                if text.count(old) < 1:
                    failures.append(f"self-test '{name}': {old.strip()!r} not in {file} "
                                    f"(update BREAKAGES)")
                    continue
                (kdir / file).write_text(text.replace(old, new, 1))
            errors, _ = validate(kdir, use_kubectl=False)
            if not file and errors:
                failures += [f"self-test: the unbroken copy fails: {e}" for e in errors]
            elif file and not errors:
                failures.append(f"self-test '{name}': NOT caught")
            elif file and not any(expect in e for e in errors):
                failures.append(f"self-test '{name}': caught, but not for {expect!r}: "
                                + " | ".join(errors))
            else:
                print(f"  self-test: {name}: " + ("passes" if not file else "rejected: "
                      + next(e for e in errors if expect in e)[:150]))
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true",
                        help="also prove that broken copies of the directory are rejected")
    parser.add_argument("--dir", type=Path, default=HERE, help="the kustomization directory")
    parser.add_argument("--no-kubectl", action="store_true",
                        help="skip the cross-check against `kubectl kustomize`")
    args = parser.parse_args()
    started = time.monotonic()
    use_kubectl = not args.no_kubectl and os.environ.get("K8S_NO_KUBECTL") != "1"
    errors, notes = validate(args.dir.resolve(), use_kubectl)
    if errors:
        print("\n".join(f"FAIL {e}" for e in errors))
        print(f"{len(errors)} problem(s) in {args.dir}")
        return 1
    print("\n".join(f"ok: {n}" for n in notes))
    if args.self_test:
        failures = self_test()
        if failures:
            print("\n".join(f"FAIL {f}" for f in failures))
            return 1
        print(f"ok: self-test: {len(BREAKAGES)} broken copies rejected, each for its reason")
    print(f"deploy/k8s valid ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
