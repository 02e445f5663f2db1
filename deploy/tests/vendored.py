#!/usr/bin/env python3
"""Checks that every third-party file we vendor into static/ is byte-identical to the file of the
npm package pinned in deploy/node/package.json, so the copy we serve cannot drift from what the
lock (and its sha512 integrity) names.

    deploy/tests/vendored.py                 (node_modules: $FLOODGATE_TEST_NODE_MODULES, or
                                              installed by deploy/node/install.sh)
    deploy/tests/vendored.py --self-test     (also proves the check fails on a changed byte,
                                              a wrong pin and a missing file)

Why a copy at all: the pages are served by the gateway alone, with no CDN and no build step
(docs/decisions.md, "The QR encoder is vendored"). Why this check: a hand-edited or re-downloaded
copy would otherwise be invisible in review.

Exit status 0 and one line per file when all match; 1 and a FAIL line per mismatch.
Python 3 standard library only.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file in the repository, npm package, version, file inside the package)
VENDORED = [
    ("static/vendor/qrcode-generator-2.0.4.js", "qrcode-generator", "2.0.4", "dist/qrcode.js"),
]


def check(root: Path, node_modules: Path) -> list[str]:
    """The failures, one line each (empty: everything matches)."""
    fails = []
    pins = json.loads((root / "deploy/node/package.json").read_text())["dependencies"]
    for ours, package, version, inner in VENDORED:
        if pins.get(package) != version:
            fails.append(f"{ours}: deploy/node/package.json pins {package} "
                         f"{pins.get(package)!r}, the copy is of {version}")
            continue
        installed = node_modules / package
        try:
            got = json.loads((installed / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError) as e:
            fails.append(f"{ours}: cannot read {installed}/package.json: {e}")
            continue
        if got != version:
            fails.append(f"{ours}: node_modules holds {package} {got}, not {version} "
                         "(rerun deploy/node/install.sh)")
            continue
        try:
            theirs = (installed / inner).read_bytes()
            mine = (root / ours).read_bytes()
        except OSError as e:
            fails.append(f"{ours}: {e}")
            continue
        if theirs != mine:
            fails.append(f"{ours}: differs from {package}@{version}/{inner} "
                         f"({len(mine)} bytes here, {len(theirs)} in the package)")
    return fails


def node_modules() -> Path:
    env = os.environ.get("FLOODGATE_TEST_NODE_MODULES")
    if env:
        return Path(env)
    out = subprocess.run([str(ROOT / "deploy/node/install.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def self_test(modules: Path) -> None:
    """The check must fail on each way a copy can drift; a check that cannot fail is no check."""
    ours, package, version, inner = VENDORED[0]
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp)
        (fake / "deploy/node").mkdir(parents=True)
        shutil.copy(ROOT / "deploy/node/package.json", fake / "deploy/node/package.json")
        (fake / ours).parent.mkdir(parents=True)
        shutil.copy(ROOT / ours, fake / ours)
        assert check(fake, modules) == [], "the unchanged copy must pass"

        body = bytearray((fake / ours).read_bytes())
        body[len(body) // 2] ^= 0x01
        (fake / ours).write_bytes(bytes(body))
        assert any("differs" in f for f in check(fake, modules)), "a flipped bit must fail"
        shutil.copy(ROOT / ours, fake / ours)

        pkg = json.loads((fake / "deploy/node/package.json").read_text())
        pkg["dependencies"][package] = "0.0.1"
        (fake / "deploy/node/package.json").write_text(json.dumps(pkg))
        assert any("pins" in f for f in check(fake, modules)), "a different pin must fail"
        shutil.copy(ROOT / "deploy/node/package.json", fake / "deploy/node/package.json")

        (fake / ours).unlink()
        assert check(fake, modules), "a missing copy must fail"
    print("vendored: self-test passed", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    modules = node_modules()
    if args.self_test:
        self_test(modules)
    fails = check(ROOT, modules)
    for f in fails:
        print(f"FAIL {f}")
    if fails:
        return 1
    for ours, package, version, inner in VENDORED:
        print(f"ok {ours} == {package}@{version}/{inner}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
