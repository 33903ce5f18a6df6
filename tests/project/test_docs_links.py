"""Every link and repository path in the README and docs resolves inside the repository.

A clone of layercake has nothing beside it (no `../shared`), so a document that points outside the
repository, or at a file that does not exist, sends a newcomer nowhere. Checked: markdown links
`[text](path)` (relative to the document) and backticked paths whose first part is a top-level entry of
the repository or that start with `./` or `../` (relative to the repository root or to the document).
Fenced code blocks, URLs and absolute paths (URL paths such as `/alerts/`, paths on a node) are not
checked; upstream files are written as `owner/repo:path` or under a name this repository does not have.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"(?:\.{1,2}/)*[\w.*-]+(?:/[\w.*-]*)+")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/|~|\$)", re.I)


def documents(repo: Path = REPO) -> list[Path]:
    """The markdown a user reads: the README, docs/, the benchmark notes and the agent's data notes."""
    return [
        repo / "README.md",
        *sorted((repo / "docs").glob("*.md")),
        *sorted((repo / "bench").glob("*.md")),
        *sorted((repo / "agents").rglob("*.md")),
    ]


def top_level(repo: Path) -> set[str]:
    """Names at the repository root that a clone has (not .git, nothing .gitignore excludes)."""
    ignore = repo / ".gitignore"
    patterns = (
        [
            line.strip().strip("/")
            for line in ignore.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")
        ]
        if ignore.is_file()
        else []
    )
    return {
        p.name
        for p in repo.iterdir()
        if p.name != ".git" and not any(fnmatch.fnmatch(p.name, pat) for pat in patterns)
    }


def resolves(target: str, bases: list[Path], repo: Path) -> bool:
    """True when `target` names an existing file or folder inside `repo`, from any of `bases`."""
    target = target.split("#", 1)[0]
    if not target:
        return True
    for base in bases:
        for found in base.glob(target) if "*" in target else [base / target]:
            inside = found.resolve().is_relative_to(repo.resolve())
            if inside and found.exists():
                return True
    return False


def repo_paths(code: str, roots: set[str]) -> list[str]:
    """The words of an inline code span that name a path of this repository."""
    words = (w.rstrip(".,;:)") for w in code.split())
    return [
        w
        for w in words
        if not EXTERNAL.match(w)
        and PATH.fullmatch(w)
        and (w.startswith(("./", "../")) or w.split("/", 1)[0] in roots)
    ]


def broken_references(doc: Path, repo: Path = REPO) -> list[str]:
    """`doc:line: target` for every link or backticked repository path that does not resolve inside `repo`."""
    roots, broken, fenced = top_level(repo), [], False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        links = [m.group(1) for m in (*LINK.finditer(line), *REFERENCE.finditer(line))]
        bad = [t for t in links if not EXTERNAL.match(t) and not resolves(t, [doc.parent], repo)]
        paths = [p for span in CODE.findall(line) for p in repo_paths(span, roots)]
        bad += [p for p in paths if not resolves(p, [repo, doc.parent], repo)]
        broken += [f"{doc.relative_to(repo)}:{number}: {target}" for target in bad]
    return broken


def _tiny_repo(tmp_path: Path, text: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "topo.py").write_text("", encoding="utf-8")
    (tmp_path / ".gitignore").write_text("/var/\n", encoding="utf-8")
    (tmp_path / "var").mkdir()
    (tmp_path / "README.md").write_text("# tiny\n", encoding="utf-8")
    doc = tmp_path / "docs" / "why.md"
    doc.write_text(text, encoding="utf-8")
    return doc


def test_it_flags_paths_beside_the_repository_and_missing_files(tmp_path: Path) -> None:
    doc = _tiny_repo(
        tmp_path,
        "From `../shared/seed/`.\nSee [the notes](../shared/research/x.md),\n"
        "`agents/gone.py` and [why](missing.md#top).\n",
    )
    assert broken_references(doc, tmp_path) == [
        "docs/why.md:1: ../shared/seed/",
        "docs/why.md:2: ../shared/research/x.md",
        "docs/why.md:3: missing.md#top",
        "docs/why.md:3: agents/gone.py",
    ]


def test_it_accepts_repo_files_urls_upstream_paths_and_code_blocks(tmp_path: Path) -> None:
    doc = _tiny_repo(
        tmp_path,
        "`agents/topo.py: parse` and [readme](../README.md) and `../README.md`.\n"
        "[vLLM](https://github.com/vllm-project/vllm) `vllm/v1/worker/gpu_worker.py`,\n"
        "`gpustack/gpustack:docs/faq.md`, `/alerts/settings/`, `var/admin-login.txt`,\n"
        "`agents/*.py`, `tests/test_<feature>.py`, [top](#why).\n"
        "```sh\ncat ../shared/seed/x.txt\n```\n",
    )
    assert broken_references(doc, tmp_path) == []


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_it_finds_every_link_and_path_of_the_docs_inside_the_repository(doc: Path) -> None:
    assert broken_references(doc) == []
