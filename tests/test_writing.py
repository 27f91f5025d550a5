"""Product code says what and why in the present tense: no lab-notebook marks in its prose.

A lab-notebook mark is history the reader cannot use: a round label ("round 12", "round H",
"ROUND9_GEMM_RULE"), a date or ISO timestamp, a clock time, a section reference into notes the
reader does not have ("spec §6.4"), or an issue-number history remark ("issue 14 item 2"). History
belongs in CHANGELOG.md, git and the dated bench result files (bench/results/), not in comments,
docstrings or strings of spica_pipeline/.

Only comments and string literals (docstrings included) are scanned, token by token, so code such
as `round(x, 4)`, `per_round` or `"round_robin"` never counts.
"""

import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "spica_pipeline"
MAX_MARKS = 5

MARKS: dict[str, re.Pattern[str]] = {
    "round": re.compile(r"\b[Rr]ounds? (?:\d+[a-z]?|[A-Z])\b|\bROUND\w*"),
    "date": re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b"),
    "clock time": re.compile(r"\b\d{1,2}:\d\d(?::\d\d)? ?(?:UTC|Z)\b"),
    "section reference": re.compile(r"§"),
    "issue history": re.compile(r"\b[Ii]ssues? #?\d+"),
}

# (path relative to the package, matched text): literals that look like a mark but are data.
NOT_MARKS = {
    # the fixed epoch a Prophet frame's synthetic timestamps start from, not a date in history
    ("space/load_predictor/predictors.py", "2000-01-01"),
}


def marks_in_source(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, matched text) of every mark in the comments and string literals of `source`."""
    found: list[tuple[int, str, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        for kind, pattern in MARKS.items():
            for match in pattern.finditer(tok.string):
                line = tok.start[0] + tok.string.count("\n", 0, match.start())
                found.append((line, kind, match.group(0)))
    return sorted(found)


def package_marks() -> list[str]:
    """'path:line: kind: text' for every mark in spica_pipeline/, the data literals left out."""
    out: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, kind, text in marks_in_source(path.read_text(encoding="utf-8")):
            if (rel, text) not in NOT_MARKS:
                out.append(f"spica_pipeline/{rel}:{line}: {kind}: {text!r}")
    return out


@pytest.mark.parametrize("snippet, kinds", [
    ("# adopted in round I (2026-12-05, 21:48 UTC)\n", ["date", "round", "clock time"]),
    ('"""See spec §6.4 and issue 14 item 2; round 9c, rounds 10-13."""\n',
     ["issue history", "round", "round", "section reference"]),
    ("RULE = 1  # bench_fidelity.ROUND9_GEMM_RULE\n", ["round"]),
    ('x = f"at {t:%Y-%m-%dT%H:%M}Z"\n', []),
    ('y = round(0.5, 4)  # one per round; per_round = 3\nmode = "round_robin"\n', []),
])
def test_scanner_finds_marks_in_prose_only(snippet: str, kinds: list[str]) -> None:
    assert sorted(kind for _line, kind, _text in marks_in_source(snippet)) == sorted(kinds)


def test_scanner_reports_the_line_inside_a_docstring() -> None:
    source = 'def f():\n    """What.\n\n    Since round 12.\n    """\n'
    assert marks_in_source(source) == [(4, "round", "round 12")]


def test_product_code_has_at_most_five_lab_notebook_marks() -> None:
    marks = package_marks()
    assert len(marks) <= MAX_MARKS, (
        f"{len(marks)} lab-notebook marks in spica_pipeline/ (at most {MAX_MARKS}); say what and why "
        "in the present tense, history goes to CHANGELOG.md:\n" + "\n".join(marks))
