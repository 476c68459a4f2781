"""The documentation keeps its promises: every citation in a code comment resolves, and the
README stays short.

Code comments cite the MIG/MPS/NVML facts by section ("facts §1.5", "§1.2-§1.5") and by source
("[S31]"), and review findings by id ("review D3", "security review H2, M4, L9", "review H1/H3",
"review D1 to D19", "(issue 21, H2)") or by a review's own section ("review §3.2"). Each must
have its heading in docs/reference/facts.md or docs/reference/reviews.md (a source: its row in
the facts' source list), so that a new citation comes with its entry. A § is a review's section
when "review" (or the review's file name) is the last cue before it on its line, else the facts'.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("fleet", "hostagent", "static", "templates", "tests")
SKIPPED_DIRS = {"__pycache__", "node_modules", ".mypy_cache", ".ruff_cache"}
TEXT_SUFFIXES = {".py", ".js", ".css", ".html", ".md", ".txt", ".yaml", ".yml", ".json", ".toml"}
FACTS = ROOT / "docs" / "reference" / "facts.md"
REVIEWS = ROOT / "docs" / "reference" / "reviews.md"
README = ROOT / "README.md"
README_MAX_LINES = 200

SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
SOURCE = re.compile(r"\[(S\d+[a-z]?)\]")
FINDING_ID = r"[A-Z]\d{1,2}\b"
SEPARATOR = r"\s*(?:,|/|\band\b|\bto\b)\s*"
FINDINGS = re.compile(
    rf"(?:\breview|\bissue \d+,)\s+({FINDING_ID}(?:{SEPARATOR}{FINDING_ID})*)", re.IGNORECASE
)
REVIEW_CUE = re.compile(r"review|agent-on-real-drivers", re.IGNORECASE)
FACTS_CUE = re.compile(r"facts", re.IGNORECASE)

HEADING_SECTION = re.compile(r"^#{1,6}\s+§(\d+(?:\.\d+)*)\s", re.MULTILINE)
HEADING_FINDING = re.compile(r"^#{1,6}\s+([A-Z]\d{1,2})\b", re.MULTILINE)
SOURCE_ROW = re.compile(r"^\|\s*(S\d+[a-z]?)\s*\|", re.MULTILINE)


def scanned_lines() -> Iterator[tuple[str, int, str]]:
    """(path, line number, line) of every text file under the scanned folders, this one aside."""
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if (
                not path.is_file()
                or path.suffix not in TEXT_SUFFIXES
                or SKIPPED_DIRS.intersection(path.parts)
                or path.resolve() == Path(__file__).resolve()
            ):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), 1):
                yield str(path.relative_to(ROOT)), number, line


def finding_ids(cited: str) -> list[str]:
    """``"D1 to D4"`` → D1, D2, D3, D4; ``"H2, M4/L9"`` → H2, M4, L9."""
    ids: list[str] = []
    tokens = re.split(rf"({SEPARATOR})", cited, flags=re.IGNORECASE)
    for i in range(0, len(tokens), 2):
        token = tokens[i].upper()
        if i >= 2 and tokens[i - 1].strip().lower() == "to" and ids and ids[-1][0] == token[0]:
            ids.extend(f"{token[0]}{n}" for n in range(int(ids[-1][1:]) + 1, int(token[1:])))
        ids.append(token)
    return ids


def citations() -> dict[str, dict[str, list[str]]]:
    """What the code cites, by kind, each with where: ``{"facts": {"1.5": ["fleet/…:13"]}}``."""
    found: dict[str, dict[str, list[str]]] = {
        "facts": {},
        "review sections": {},
        "sources": {},
        "findings": {},
    }
    for path, number, line in scanned_lines():
        where = f"{path}:{number}"
        for match in SECTION.finditer(line):
            before = line[: match.start()]
            review_at = max((m.end() for m in REVIEW_CUE.finditer(before)), default=-1)
            facts_at = max((m.end() for m in FACTS_CUE.finditer(before)), default=-1)
            kind = "review sections" if review_at > facts_at else "facts"
            found[kind].setdefault(match.group(1), []).append(where)
        for match in SOURCE.finditer(line):
            found["sources"].setdefault(match.group(1), []).append(where)
        for match in FINDINGS.finditer(line):
            for finding in finding_ids(match.group(1)):
                found["findings"].setdefault(finding, []).append(where)
    return found


def unresolved(cited: dict[str, list[str]], known: set[str]) -> list[str]:
    return [f"{key} (cited at {', '.join(cited[key][:3])})" for key in sorted(set(cited) - known)]


def test_the_scan_finds_the_citations_the_code_is_known_to_make():
    """Guards the patterns themselves: a scan that finds nothing would pass everything."""
    found = citations()
    assert {"1.5", "1.6", "2", "5.1"} <= set(found["facts"])
    assert {"1", "3.2"} <= set(found["review sections"])
    assert {f"D{n}" for n in range(1, 20)} | {"H1", "H2", "H3", "L6", "M4", "L9"} <= set(
        found["findings"]
    )


def test_finding_lists_and_ranges_are_read_as_ids():
    assert finding_ids("D1 to D4") == ["D1", "D2", "D3", "D4"]
    assert finding_ids("H2, M4, L9") == ["H2", "M4", "L9"]
    assert finding_ids("H1/H3") == ["H1", "H3"]
    assert finding_ids("D5 and D15") == ["D5", "D15"]
    assert finding_ids("d2 TO d3") == ["D2", "D3"]


def test_every_facts_section_the_code_cites_has_its_heading():
    known = set(HEADING_SECTION.findall(FACTS.read_text(encoding="utf-8")))
    missing = unresolved(citations()["facts"], known)
    assert not missing, f"cited facts sections without a heading in {FACTS.name}: {missing}"


def test_every_source_the_code_cites_is_in_the_source_list():
    known = set(SOURCE_ROW.findall(FACTS.read_text(encoding="utf-8")))
    missing = unresolved(citations()["sources"], known)
    assert not missing, f"cited sources without a row in {FACTS.name}: {missing}"


def test_every_review_finding_the_code_cites_has_its_entry():
    known = set(HEADING_FINDING.findall(REVIEWS.read_text(encoding="utf-8")))
    missing = unresolved(citations()["findings"], known)
    assert not missing, f"cited review findings without a heading in {REVIEWS.name}: {missing}"


def test_every_review_section_the_code_cites_has_its_entry():
    known = set(HEADING_SECTION.findall(REVIEWS.read_text(encoding="utf-8")))
    missing = unresolved(citations()["review sections"], known)
    assert not missing, f"cited review sections without a heading in {REVIEWS.name}: {missing}"


def test_the_facts_cite_only_sources_of_their_own_list():
    text = FACTS.read_text(encoding="utf-8")
    listed = set(SOURCE_ROW.findall(text))
    assert listed, "no source list in facts.md"
    assert set(SOURCE.findall(text)) <= listed


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines: move some to docs/"


def test_the_readmes_relative_links_resolve():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]
    assert local, "the README links to no page of docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
