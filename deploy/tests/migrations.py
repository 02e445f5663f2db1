#!/usr/bin/env python3
"""Checks the sqlx migrations in migrations/ (the rule is in docs/decisions.md, "Numbering
migrations on parallel branches").

    deploy/tests/migrations.py [--base REF]
    deploy/tests/migrations.py --self-test

Fails when
- a file in migrations/ is not named `NNNN_words.sql` (four digits, `_`, lower-case words
  joined by `_`): sqlx would read another name differently or not at all;
- two migrations share a number, or numbers do not strictly increase in file-name order (what a
  merge of two branches that both took the next free number looks like: the files have
  different names, so git merges them without a conflict);
- compared with the base (by default the merge base of HEAD and `main`, `origin/main` if there
  is one): a migration of the base was edited, renamed or removed (sqlx keeps each applied
  migration's checksum and refuses a database on which it changed), or a new migration is not
  numbered above every migration of the base (it would run out of order on databases that
  follow main). Gaps in the numbering are fine.

Without git or a `main` ref the comparison is skipped with a note; the file checks still run.
Exit status 0 and one summary line when all is well, 1 and a FAIL line per problem otherwise.
Python 3 standard library only.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^(\d{4})_([a-z0-9]+(?:_[a-z0-9]+)*)\.sql$")


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    # GIT_DIR and friends (set inside git hooks) would point every call at another repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env=env)


def default_base(repo: Path) -> str | None:
    """The merge base of HEAD and main: what this branch started from."""
    for ref in ("origin/main", "main"):
        if git(repo, "rev-parse", "--verify", "--quiet", ref + "^{commit}").returncode == 0:
            mb = git(repo, "merge-base", "HEAD", ref)
            if mb.returncode == 0:
                return mb.stdout.decode().strip()
    return None


def base_migrations(repo: Path, base: str, folder: str) -> dict[str, bytes] | None:
    """The migrations of commit `base`, by file name, or None when git cannot say."""
    ls = git(repo, "ls-tree", "--name-only", f"{base}:{folder}")
    if ls.returncode != 0:
        return None
    out = {}
    for name in ls.stdout.decode().split():
        blob = git(repo, "cat-file", "blob", f"{base}:{folder}/{name}")
        if blob.returncode != 0:
            return None
        out[name] = blob.stdout
    return out


def check(repo: Path, folder: str = "migrations", base: str | None = None,
          compare: bool = True) -> tuple[list[str], list[str]]:
    """(failures, notes) for the migrations folder of the working tree at `repo`."""
    failures: list[str] = []
    notes: list[str] = []
    mdir = repo / folder
    if not mdir.is_dir():
        return [f"{folder}/ not found under {repo}"], notes
    names = sorted(p.name for p in mdir.iterdir())
    numbered: list[tuple[int, str]] = []
    for name in names:
        m = NAME.match(name)
        if not m or not (mdir / name).is_file():
            failures.append(f"{folder}/{name}: not a migration name (want NNNN_lower_case_words.sql)")
            continue
        numbered.append((int(m.group(1)), name))
    seen: dict[int, str] = {}
    last = None
    for number, name in numbered:
        if number in seen:
            failures.append(f"{folder}/{name}: number {number:04} is also {seen[number]}; "
                            "renumber the one not yet on main to the next free number")
        elif last is not None and number < last:
            failures.append(f"{folder}/{name}: numbers must increase in file-name order")
        seen.setdefault(number, name)
        last = number

    if not compare:
        return failures, notes
    if base is None:
        base = default_base(repo)
        if base is None:
            notes.append("no `main` ref (or no git): the comparison with main was skipped")
            return failures, notes
    old = base_migrations(repo, base, folder)
    if old is None:
        notes.append(f"cannot read {folder}/ at {base}: the comparison with main was skipped")
        return failures, notes
    by_number = {number: name for number, name in numbered}
    renamed = set()
    for name, content in sorted(old.items()):
        path = mdir / name
        m = NAME.match(name)
        twin = by_number.get(int(m.group(1))) if m else None
        if not path.is_file() and twin is not None and twin not in old:
            renamed.add(twin)
            failures.append(f"{folder}/{name}: on main but renamed here to {twin}; "
                            "a migration on main never changes")
        elif not path.is_file():
            failures.append(f"{folder}/{name}: on main but missing here (removed or renamed); "
                            "a migration on main never changes")
        elif path.read_bytes() != content:
            failures.append(f"{folder}/{name}: differs from main's; a migration on main never "
                            "changes (databases keep its checksum): add a new migration instead")
    old_numbers = [int(m.group(1)) for m in map(NAME.match, old) if m]
    top = max(old_numbers, default=0)
    for number, name in numbered:
        if name not in old and name not in renamed and number <= top:
            failures.append(f"{folder}/{name}: a new migration must be numbered above main's "
                            f"highest ({top:04}); renumber it to {top + 1:04} or above")
    notes.append(f"compared with {base[:12]} ({len(old)} migrations there)")
    return failures, notes


# --- self-test -----------------------------------------------------------------------------


def self_test() -> list[str]:
    """Each case builds a git repository whose `main` holds 0001, 0002 and 0004 (a gap), then
    changes the working tree of a branch, and says which failure it must produce (or none)."""
    cases = [
        ("a new migration above main's", {"0005_new.sql": "x"}, [], None),
        ("a gap is fine", {"0009_new.sql": "x"}, [], None),
        ("two branches took 0005", {"0005_one.sql": "x", "0005_two.sql": "y"}, [],
         "also 0005_one.sql"),
        ("a name without four digits", {"5_new.sql": "x"}, [], "not a migration name"),
        ("a name with a dash", {"0005-new.sql": "x"}, [], "not a migration name"),
        ("an upper-case name", {"0005_New.sql": "x"}, [], "not a migration name"),
        ("five digits", {"00005_new.sql": "x"}, [], "not a migration name"),
        ("a stray file", {"notes.txt": "x"}, [], "not a migration name"),
        ("a migration on main edited", {"0002_orders.sql": "changed"}, [], "differs from main"),
        ("a migration on main renamed", {"0002_order_lines.sql": "b"}, ["0002_orders.sql"],
         "renamed here to 0002_order_lines.sql"),
        ("a migration on main removed", {}, ["0004_more.sql"], "missing here"),
        ("a new one in main's gap", {"0003_late.sql": "x"}, [], "above main's highest (0004)"),
    ]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, add, remove, expect in cases:
            repo = Path(tmp) / re.sub(r"\W+", "-", name)
            (repo / "migrations").mkdir(parents=True)
            for f, body in {"0001_core.sql": "a", "0002_orders.sql": "b", "0004_more.sql": "c"}.items():
                (repo / "migrations" / f).write_text(body)
            setup = [["init", "-q", "-b", "main"], ["add", "."],
                     ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"],
                     ["checkout", "-qb", "work"]]
            for args in setup:
                r = git(repo, *args)
                if r.returncode != 0:
                    return [f"self-test: git {' '.join(args)} failed: {r.stderr.decode()}"]
            for f in remove:
                (repo / "migrations" / f).unlink()
            for f, body in add.items():
                (repo / "migrations" / f).write_text(body)
            got, _ = check(repo)
            if expect is None and got:
                failures.append(f"self-test '{name}': want no failure, got {got}")
            elif expect is not None and not (len(got) == 1 and expect in got[0]):
                failures.append(f"self-test '{name}': want one FAIL with {expect!r}, got {got}")
            else:
                print(f"  self-test: {name}: " + (f"rejected: {got[0]}" if got else "passes"))
        # Without a main ref the file checks still run and the comparison is reported skipped.
        lone = Path(tmp) / "no-git"
        (lone / "migrations").mkdir(parents=True)
        (lone / "migrations" / "0001_a.sql").write_text("a")
        (lone / "migrations" / "0001_b.sql").write_text("b")
        got, notes = check(lone)
        if len(got) != 1 or not any("skipped" in n for n in notes):
            failures.append(f"self-test 'no git': want one duplicate and a skip note, got {got} {notes}")
        else:
            print("  self-test: no git: the duplicate is still caught, the comparison skipped")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="compare with this commit instead of the merge base with main")
    parser.add_argument("--self-test", action="store_true", help="check the checker on made-up trees")
    args = parser.parse_args()
    if args.self_test:
        failures = self_test()
        for f in failures:
            print(f"FAIL {f}")
        if failures:
            return 1
    failures, notes = check(ROOT, base=args.base)
    for f in failures:
        print(f"FAIL {f}")
    for n in notes:
        print(f"note: {n}")
    count = len([p for p in (ROOT / "migrations").glob("*.sql")])
    print(f"migrations: {count} files, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
