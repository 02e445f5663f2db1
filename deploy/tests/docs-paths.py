#!/usr/bin/env python3
"""Checks that every repository path the docs name exists, so they cannot drift silently.

    deploy/tests/docs-paths.py [FILE.md ...]     (default: README.md and docs/*.md)
    deploy/tests/docs-paths.py --self-test

What counts as a path (outside fenced code blocks):
- a markdown link target that is not a URL or an anchor (`[x](gateway.md#y)`): it must exist
  relative to the document's folder, as it does where the markdown is rendered;
- a word of an inline code span (split on spaces, so commands count: `deploy/stack up`) made
  only of `A-Z a-z 0-9 _ . - / * { } ,` that contains a `/` or ends in a file extension we keep
  (.rs .md .toml .sql .sh .py .json .js .mjs .html .css .yaml .yml .txt .svg .lock). Not words
  starting with `/` (URL paths, the machine's files), and not media types (`text/plain`).

When such a path exists. Braces expand first (`holds/{repo,take}` is `holds/repo` and
`holds/take`); `*` is a glob. Then it exists when
- its first segment is a top-level entry of the repository (`deploy/`, `booking/`…): it must be
  a file or folder from the root;
- otherwise it may also be the tail of one (on a `/`): the docs name files relative to a folder
  named nearby (`inventory/sweeper.rs` under booking/src), and Rust modules without `.rs`
  (`cart/store` is `orders/cart/store.rs`).
Files are those git tracks plus new ones not ignored; paths git ignores (`.stack/…`,
`target/…`) are run-time state and are not checked.

A deliberate non-path: `<!-- docs-paths: ignore WORD WORD (why) -->` anywhere in that document
(the reason in parentheses is optional); put it after the paragraph that names the word.

Exit status 0 and one summary line when every path exists; 1 and a FAIL line per missing path
(file:line and the path); 2 when git cannot list the files. Python 3 standard library only.
"""

import argparse
import fnmatch
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = (".rs", ".md", ".toml", ".sql", ".sh", ".py", ".json", ".js", ".mjs", ".html",
              ".css", ".yaml", ".yml", ".txt", ".svg", ".lock")
WORD = re.compile(r"^[A-Za-z0-9_.\-/*{},]+$")
MEDIA_TYPES = ("text/", "application/", "image/", "multipart/")
IGNORE = re.compile(r"<!--\s*docs-paths:\s*ignore\s+([^()]*?)\s*(?:\([^()]*\))?\s*-->", re.S)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"(`+)(.+?)\1", re.S)


class Tree:
    """What exists: files and folders from the root, and every tail of them."""

    def __init__(self, root: Path, files: list[str], ignored: set[str]):
        self.root = root
        self.files = set(files)
        self.dirs = {str(Path(f).parent) for f in files if "/" in f}
        for d in list(self.dirs):
            while "/" in d:
                d = d.rsplit("/", 1)[0]
                self.dirs.add(d)
        self.entries = self.files | self.dirs
        self.top = {e.split("/", 1)[0] for e in self.entries}
        self.tails = set()
        for e in self.entries:
            parts = e.split("/")
            for i in range(len(parts)):
                tail = "/".join(parts[i:])
                self.tails.add(tail)
                if tail.endswith(".rs"):
                    self.tails.add(tail[:-3])
        self.ignored = ignored

    def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        if not path:
            return True
        anchored = path.split("/", 1)[0] in self.top and "/" in path
        if "*" in path:
            if any(fnmatch.fnmatchcase(e, path) for e in self.entries):
                return True
            return not anchored and any(fnmatch.fnmatchcase(t, path) for t in self.tails)
        if path in self.entries:
            return True
        return not anchored and path in self.tails


def expand(word: str) -> list[str]:
    """`a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (nested braces too)."""
    m = re.search(r"\{([^{}]*)\}", word)
    if not m:
        return [word]
    out = []
    for alt in m.group(1).split(","):
        out += expand(word[: m.start()] + alt + word[m.end():])
    return out


def is_path_word(word: str) -> bool:
    if not WORD.match(word) or word.startswith(("/", "-")) or not re.search(r"[A-Za-z]", word):
        return False
    if word.startswith(MEDIA_TYPES) or "..." in word:
        return False
    return "/" in word.strip("/") or word.endswith("/") or word.lower().endswith(EXTENSIONS)


def candidates(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, path) for every path the markdown names; kind is `link` or `code`."""
    # Fenced blocks are blanked (their lines kept, so line numbers stay right).
    lines, fence = [], None
    for line in text.split("\n"):
        stripped = line.lstrip()
        if fence:
            if stripped.startswith(fence):
                fence = None
            lines.append("")
        elif stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            lines.append("")
        else:
            lines.append(line)
    body = "\n".join(lines)
    out = []
    # A code span may run over a line break (never over a blank line, a paragraph's end).
    for m in CODE.finditer(body):
        if "\n\n" in m.group(2):
            continue
        for w in re.finditer(r"\S+", m.group(2)):
            if is_path_word(w.group(0)):
                out.append((body.count("\n", 0, m.start(2) + w.start()) + 1, "code", w.group(0)))
    without_code = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), body)
    for m in LINK.finditer(without_code):
        target = m.group(1).split("#", 1)[0]
        if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target):
            out.append((without_code.count("\n", 0, m.start()) + 1, "link", target))
    return sorted(out)


def check_file(tree: Tree, doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    ignore = set()
    for m in IGNORE.finditer(text):
        ignore.update(m.group(1).split())
    rel_doc = doc.relative_to(tree.root)
    failures = []
    for line, kind, path in candidates(text):
        if path in ignore:
            continue
        if kind == "link":
            target = (doc.parent / path).resolve()
            try:
                rel = str(target.relative_to(tree.root))
            except ValueError:
                failures.append(f"{rel_doc}:{line}: link `{path}` leaves the repository")
                continue
            if rel not in tree.entries and rel not in tree.ignored and rel != ".":
                failures.append(f"{rel_doc}:{line}: link `{path}` ({rel}) does not exist")
            continue
        for p in expand(path):
            if p.rstrip("/") in tree.ignored or any(p.startswith(i + "/") for i in tree.ignored):
                continue
            if not tree.exists(p):
                shown = f"`{path}`" + (f" ({p})" if p != path else "")
                failures.append(f"{rel_doc}:{line}: {shown} names no file or folder of the repository")
    return failures


def git_tree(root: Path, docs: list[Path]) -> Tree:
    ls = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others",
                         "--exclude-standard", "-z"], capture_output=True)
    if ls.returncode != 0:
        print(f"error: git ls-files failed: {ls.stderr.decode().strip()}", file=sys.stderr)
        sys.exit(2)
    files = [f for f in ls.stdout.decode().split("\0") if f and (root / f).exists()]
    # Which of the named paths git ignores (run-time state such as .stack/ and target/).
    named = sorted({p.rstrip("/") for d in docs for _, k, w in candidates(d.read_text(encoding="utf-8"))
                    if k == "code" for p in expand(w) if "*" not in p})
    ci = subprocess.run(["git", "-C", str(root), "check-ignore", "--no-index", "--stdin", "-z"],
                        input="\0".join(named).encode(), capture_output=True)
    ignored = {p for p in ci.stdout.decode().split("\0") if p}
    return Tree(root, files, ignored)


def run(root: Path, docs: list[Path]) -> list[str]:
    tree = git_tree(root, docs)
    failures = []
    for doc in docs:
        failures += check_file(tree, doc)
    return failures


# --- self-test -----------------------------------------------------------------------------


def self_test() -> list[str]:
    """A made-up repository, and documents that must pass or fail with a given path."""
    files = ["booking/src/inventory/sweeper.rs", "booking/src/inventory/holds/repo.rs",
             "booking/src/inventory/holds/take.rs", "booking/src/orders/cart/store.rs",
             "gateway/src/admission.rs", "docs/gateway.md", "docs/code-map.md",
             "deploy/bench/holds.sh", "deploy/bench/orders.sh", "README.md", ".gitignore"]
    cases = [
        ("a path from the root", "`gateway/src/admission.rs`", None),
        ("a folder", "`booking/src/inventory/`", None),
        ("a path relative to a folder named nearby", "`inventory/sweeper.rs`", None),
        ("a Rust module without .rs", "`cart/store`", None),
        ("braces", "`holds/{repo,take}`", None),
        ("a glob", "`deploy/bench/*.sh`", None),
        ("a command's path", "`deploy/bench/holds.sh --quick`", None),
        ("a link beside the document", "[gw](gateway.md#routes)", None),
        ("URLs, URL paths, media types", "`GET /api/holds` `http://x/y.rs` `text/plain` [x](https://e.org/a.md)", None),
        ("git-ignored run-time state", "`.stack/logs/postgres.log`", None),
        ("an exempted word", "`rate/60000`\n<!-- docs-paths: ignore rate/60000 -->", None),
        ("exempted words with a reason", "`a/b` `c/d`\n\n<!-- docs-paths: ignore a/b c/d (why) -->", None),
        ("the reason exempts nothing", "`why/not`\n<!-- docs-paths: ignore a/b (why/not) -->", "`why/not`"),
        ("fenced code is not read", "```\n`decide.rs`\n```", None),
        ("a code span over a line break", "`200\n{}`; its hold/units go", None),
        ("a path on a code span's second line", "see `a\ndecide.rs`", ":2: `decide.rs`"),
        ("a missing file name", "Decisions are plain functions (`decide.rs`).", "`decide.rs`"),
        ("a missing path from the root", "`gateway/src/decide.rs`", "`gateway/src/decide.rs`"),
        ("a root path is not matched as a tail", "`inventory/sweeper.rs` `src/inventory/sweeper.rs` `deploy/sweeper.rs`", "`deploy/sweeper.rs`"),
        ("one of the braces missing", "`holds/{repo,pick}`", "(holds/pick)"),
        ("a glob matching nothing", "`deploy/bench/*.py`", "`deploy/bench/*.py`"),
        ("a missing link", "[ops](operations.md)", "link `operations.md`"),
        ("a link resolved from the document's folder", "[gw](docs/gateway.md)", "link `docs/gateway.md`"),
        ("an unexempted non-path", "`rate/60000`", "`rate/60000`"),
    ]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for f in files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text("x\n" if f != ".gitignore" else "/.stack/\n")
        subprocess.run(["git", "-C", tmp, "init", "-q"], check=True)
        subprocess.run(["git", "-C", tmp, "add", "."], check=True)
        for name, text, expect in cases:
            doc = root / "docs" / "case.md"
            doc.write_text(text + "\n")
            got = run(root, [doc])
            if expect is None and got:
                failures.append(f"self-test '{name}': want no failure, got {got}")
            elif expect is not None and not (len(got) == 1 and expect in got[0]):
                failures.append(f"self-test '{name}': want one FAIL with {expect!r}, got {got}")
            else:
                print(f"  self-test: {name}: " + (f"rejected: {got[0]}" if got else "passes"))
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md, docs/*.md)")
    parser.add_argument("--self-test", action="store_true", help="check the checker on made-up documents")
    args = parser.parse_args()
    if args.self_test:
        failures = self_test()
        for f in failures:
            print(f"FAIL {f}")
        if failures:
            return 1
    docs = [p.resolve() for p in args.files] or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    failures = run(ROOT, docs)
    for f in failures:
        print(f"FAIL {f}")
    print(f"docs paths: {len(docs)} documents, {len(failures)} missing paths")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
