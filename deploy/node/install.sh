#!/usr/bin/env bash
# The npm tools the tests and checks use (Stripe's Node library, axe-core, a QR decoder, jose,
# playwright-core), from deploy/node/package.json and its committed package-lock.json.
#
#   deploy/node/install.sh [DIR]   install them with `npm ci` into DIR/node_modules (default
#                                  .stack/node, or $FLOODGATE_STACK_DIR/node) and print that
#                                  path on stdout; everything else goes to stderr
#   deploy/node/install.sh --check only check that Node.js >= 20 and npm are on the PATH
#
# `deploy/stack test` runs it and exports the path as FLOODGATE_TEST_NODE_MODULES. The install
# is kept between runs and redone only when package.json or package-lock.json changes (a stamp
# holds their sha256), so CI pays for `npm ci` once per lock. Adding a tool: edit package.json
# with an exact version, run `npm install --package-lock-only` here, commit both files.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
NODE_MIN=20

log() { printf '\033[1m[node]\033[0m %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Debian's own `nodejs` package is 18, too old for stripe 23 and playwright-core 1.65 (both
# declare node >= 20): say so plainly rather than let npm or a test fail obscurely.
check_node() {
  local node version major
  node="$(command -v node || true)"
  [ -n "$node" ] || die "Node.js >= $NODE_MIN is needed for the tests and \`node\` is not on the PATH: install Node.js $NODE_MIN or later (https://nodejs.org/, or NodeSource's Debian packages; Debian's own \`nodejs\` is 18, too old)"
  version="$("$node" -p 'process.versions.node' 2>/dev/null || true)"
  major="${version%%.*}"
  case "$major" in ''|*[!0-9]*) die "cannot read the version of $node" ;; esac
  [ "$major" -ge "$NODE_MIN" ] || die "Node.js >= $NODE_MIN is needed for the tests, found v$version at $node (Debian's own \`nodejs\` is 18): install Node.js $NODE_MIN or later (https://nodejs.org/, or NodeSource's Debian packages) and put it first on the PATH"
  command -v npm >/dev/null || die "npm is not on the PATH (it comes with Node.js from nodejs.org; on Debian it is the separate \`npm\` package)"
  echo "$version"
}

if [ "${1:-}" = --check ]; then check_node >/dev/null; exit 0; fi

version="$(check_node)"
dest="${1:-${FLOODGATE_STACK_DIR:-$ROOT/.stack}/node}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
# Two test runs sharing one state directory must not run `npm ci` into the same folder at once.
exec 9>"$dest/.lock"
flock 9

want="$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)"
stamp="$dest/.lock.sha256"
if [ -d "$dest/node_modules" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$dest/node_modules"
  exit 0
fi
log "installing the npm test tools into $dest (node v$version, npm ci)"
rm -f "$stamp"
cp "$HERE/package.json" "$HERE/package-lock.json" "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund --loglevel=error >&2) \
  || die "npm ci in $dest failed (is the npm registry reachable?)"
echo "$want" > "$stamp"
echo "$dest/node_modules"
