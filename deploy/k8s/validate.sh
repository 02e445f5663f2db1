#!/usr/bin/env bash
# Validates deploy/k8s against the Kubernetes API schemas, offline (CI runs it; no cluster, no
# kubectl needed). validate.py renders the kustomization as `kubectl kustomize` would, checks
# every document with kubernetes-validate in strict mode against the Kubernetes versions it
# names (K8S_VERSIONS), then runs check.py; any problem is a non-zero exit and a FAIL line.
#
#   deploy/k8s/validate.sh              the manifests in this directory
#   deploy/k8s/validate.sh --self-test  that, then proof it rejects deliberately broken copies
#
# The tools (requirements.txt, pinned by hash) go into target/k8s-validate/venv, git- and
# docker-ignored like the rest of target/; the venv is rebuilt when requirements.txt changes.
# Set K8S_NO_KUBECTL=1 to skip the cross-check against an installed kubectl's rendering.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/target/k8s-validate/venv"
REQ="$ROOT/deploy/k8s/requirements.txt"

log() { printf '\033[1m[k8s validate]\033[0m %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$VENV/requirements.txt"; then
  log "installing kubernetes-validate (pinned by hash) into target/k8s-validate/venv"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q --require-hashes -r "$REQ"; then
    rm -rf "$VENV"
    log "error: could not install deploy/k8s/requirements.txt (PyPI reachable?)"
    exit 1
  fi
  cp "$REQ" "$VENV/requirements.txt"   # the stamp: a changed requirements.txt rebuilds
fi

if ! "$VENV/bin/python" "$ROOT/deploy/k8s/validate.py" "$@"; then
  log "error: deploy/k8s failed validation (FAIL lines above)"
  exit 1
fi
