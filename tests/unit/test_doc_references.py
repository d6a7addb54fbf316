"""The code cites only documents a reader of the repository has: every `docs/<name>.md` named in the package, the
benchmarks, the tests and the README exists, and nothing cites the team's notes outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*ROOT.glob("asyncrl/**/*.py"), *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("tests/**/*.py"),
           ROOT / "README.md", *ROOT.glob("docs/*.md")]
OUTSIDE = ("DESIGN" + ".md", "ALGORITHMS" + ".md")  # split so that this file does not cite them itself


def test_cited_docs_exist() -> None:
    cited = {(p, m) for p in SOURCES for m in re.findall(r"docs/[\w-]+\.md", p.read_text())}
    assert cited, "no document is cited at all: the pattern is wrong"
    missing = sorted({f"{p.relative_to(ROOT)}: {m}" for p, m in cited if not (ROOT / m).is_file()})
    assert missing == []


def test_nothing_cites_notes_outside_the_repository() -> None:
    found = sorted(f"{p.relative_to(ROOT)}: {name}" for p in SOURCES for name in OUTSIDE if name in p.read_text())
    assert found == []
