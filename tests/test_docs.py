"""The project's own docs (README.md, docs/) stay true to the code.

- every operation of the served OpenAPI document is described in docs/api.md,
  and every ``/api/`` path docs/api.md describes as built is served;
- every environment variable config/settings.py reads is in
  docs/operations.md;
- every ``docs/*.md`` cited in the repository's text exists, and every
  relative Markdown link (and its ``#anchor``) resolves;
- nothing outside docs/ still cites the design and contract files that lived
  outside the repository.

Files are the repository's tracked ones (``git ls-files``) plus new ones under
docs/, as they are in the working tree. No database is needed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
from django.urls import Resolver404, resolve
from drf_spectacular.generators import SchemaGenerator

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
API_DOC = DOCS / "api.md"
OPERATIONS_DOC = DOCS / "operations.md"
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# The section of docs/api.md that lists what is planned, not served.
NOT_BUILT_HEADING = "## Not built yet"

FENCED_BLOCK = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
DOCUMENTED_OPERATION = re.compile(rf"(?<![\w/])({'|'.join(METHODS)}) (/api/[\w{{}}./-]*)")
API_PATH = re.compile(r"(?<![\w$/.{}-])/api/[\w{}./-]*")
PATH_PARAMETER = re.compile(r"\{[^}/]*\}")
# Values tried for a path parameter when resolving a documented path: an int,
# a UUID, a string (whatever converter the route uses).
PARAMETER_SAMPLES = ("1", "00000000-0000-4000-8000-000000000000", "x")

# How config/settings.py reads the environment (django-environ, and os for
# good measure).
ENV_READ = re.compile(
    r"""\benv(?:\.\w+)?\(\s*["']([A-Z][A-Z0-9_]*)["']"""
    r"""|\bEnv\(\)\.\w+\(\s*["']([A-Z][A-Z0-9_]*)["']"""
    r"""|["']([A-Z][A-Z0-9_]*)["']\s+in\s+(?:env|os\.environ)\b"""
    r"""|\bos\.environ(?:\.get)?[\[(]\s*["']([A-Z][A-Z0-9_]*)["']"""
    r"""|\bos\.getenv\(\s*["']([A-Z][A-Z0-9_]*)["']"""
)

CITED_DOC = re.compile(r"(?<![\w./-])docs/[\w./-]*?\.md\b")
MARKDOWN_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)

# Citations of the files handed to the team outside the repository.
OUTSIDE_CITATION = re.compile(
    r"shared/API\.md|shared/DESIGN\.md|\.\./shared\b|(?<![\w.-])DESIGN\.md"
)


# --- reading the repository ------------------------------------------------------


def _git_ls_files(*args: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [p for p in out.decode().split("\0") if p]


@cache
def _repository_files() -> tuple[str, ...]:
    """Tracked files, plus untracked new ones under docs/, that exist now."""
    files = set(_git_ls_files())
    files |= set(_git_ls_files("--others", "--exclude-standard", "--", "docs"))
    return tuple(sorted(p for p in files if (ROOT / p).is_file()))


@cache
def _text(path: str) -> str | None:
    """The file's text, or None for a binary file."""
    data = (ROOT / path).read_bytes()
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def _text_files() -> list[tuple[str, str]]:
    return [(p, t) for p in _repository_files() if (t := _text(p)) is not None]


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _without_code(markdown: str) -> str:
    """Markdown with fenced blocks and inline code spans blanked out (line
    numbers kept)."""
    blanked = FENCED_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)
    return INLINE_CODE.sub("", blanked)


def _without_fences(markdown: str) -> str:
    return FENCED_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)


# --- 1. docs/api.md and the OpenAPI document ---------------------------------------


def _normalized(path: str) -> str:
    """``/api/purchases/{saga_id}/`` and ``/api/purchases/{id}/`` are one path."""
    return PATH_PARAMETER.sub("{}", path.rstrip("."))


@cache
def _served_operations() -> frozenset[tuple[str, str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    operations = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method.upper() in METHODS
    }
    assert operations, "the OpenAPI document has no operation"
    return frozenset(operations)


def _api_doc_as_built() -> str:
    """docs/api.md without its "Not built yet" section and without fenced
    blocks (examples, curl sessions)."""
    text = API_DOC.read_text()
    start = text.find(NOT_BUILT_HEADING)
    if start != -1:
        end = text.find("\n## ", start + len(NOT_BUILT_HEADING))
        text = text[:start] + (text[end:] if end != -1 else "")
    return _without_fences(text)


def _documented_operations() -> dict[tuple[str, str], str]:
    """(method, normalized path) -> the operation as docs/api.md writes it."""
    return {
        (method, _normalized(path)): f"{method} {path}"
        for method, path in DOCUMENTED_OPERATION.findall(_api_doc_as_built())
    }


def _resolve(path: str):
    """The view serving ``path`` (its parameters filled with sample values),
    or None."""
    for sample in PARAMETER_SAMPLES:
        try:
            return resolve(PATH_PARAMETER.sub(sample, path))
        except Resolver404:
            continue
    return None


def test_every_served_operation_is_described_in_the_api_doc():
    documented = _documented_operations()

    missing = sorted(
        f"{method} {path}"
        for method, path in _served_operations()
        if (method, _normalized(path)) not in documented
    )

    assert not missing, (
        f"operations served at /api/schema/ but not described in docs/api.md "
        f"(write them as `METHOD /api/path/`): {missing}"
    )


def test_every_api_path_the_doc_describes_is_served():
    text = _api_doc_as_built()
    paths = {p.rstrip(".") for p in API_PATH.findall(text)} - {"/api/"}
    assert paths, "docs/api.md describes no /api/ path"

    not_served = sorted(p for p in paths if _resolve(p) is None)

    assert not not_served, (
        f"docs/api.md describes these paths as built, but no route serves them "
        f"(list planned ones under {NOT_BUILT_HEADING!r}): {not_served}"
    )


def test_every_operation_the_doc_describes_is_served_with_its_method():
    documented = _documented_operations()
    assert documented, "docs/api.md describes no operation"
    in_schema = {(m, _normalized(p)) for m, p in _served_operations()}

    wrong = []
    for (method, path), as_written in sorted(documented.items()):
        if (method, path) in in_schema:
            continue
        match = _resolve(path)
        view = getattr(match.func, "view_class", None) if match else None
        if view is None or not hasattr(view, method.lower()):
            wrong.append(as_written)

    assert not wrong, f"docs/api.md describes operations nothing serves: {wrong}"


# --- 2. settings and docs/operations.md ---------------------------------------------


def _settings_sources() -> list[Path]:
    module = ROOT / "config" / "settings.py"
    if module.is_file():
        return [module]
    return sorted((ROOT / "config" / "settings").glob("*.py"))


def _environment_variables_read() -> set[str]:
    names: set[str] = set()
    for source in _settings_sources():
        for match in ENV_READ.finditer(source.read_text()):
            names.update(g for g in match.groups() if g)
    return names


def test_the_settings_reader_finds_the_variables():
    # A guard for the test below: a reshaped settings module must not make it
    # pass by finding nothing.
    names = _environment_variables_read()

    assert {
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "SECRET_KEY",
        "DEBUG",
        "BOXOFFICE_VAR_DIR",
    } <= names
    assert len(names) >= 20


def test_every_environment_variable_the_settings_read_is_in_operations_doc():
    documented = OPERATIONS_DOC.read_text()

    missing = sorted(
        name
        for name in _environment_variables_read()
        if not re.search(rf"(?<![A-Z0-9_]){name}(?![A-Z0-9_])", documented)
    )

    assert not missing, f"read in config/settings.py, absent from docs/operations.md: {missing}"


# --- 3. cited docs and relative links -------------------------------------------------


def _existing_docs() -> set[str]:
    # Compared as strings: "docs/api.md" is not "docs/api.md", whatever the
    # file system says.
    return {p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md")}


def _missing_doc_citations(*, markdown: bool) -> list[str]:
    existing = _existing_docs()
    missing = []
    for path, text in _text_files():
        if path.endswith(".md") != markdown:
            continue
        for match in CITED_DOC.finditer(text):
            if match.group(0) not in existing:
                missing.append(f"{path}:{_line_of(text, match.start())}: {match.group(0)}")
    return missing


def test_every_doc_cited_in_the_readme_and_docs_exists():
    missing = _missing_doc_citations(markdown=True)

    assert not missing, f"Markdown cites docs that do not exist: {missing}"


def test_every_doc_cited_in_the_code_exists():
    missing = _missing_doc_citations(markdown=False)

    assert not missing, f"code, comments or config cite docs that do not exist: {missing}"


# A cited section: docs/design.md, "The saga" (or docs/design.md "The saga").
CITED_SECTION = re.compile(r'(docs/[a-z_]+\.md),?\s+"([^"]+)"')


def test_every_section_cited_in_the_code_is_a_heading_of_that_doc():
    missing = []
    for path, text in _text_files():
        if path.endswith(".md") or path == THIS_FILE:
            continue
        for match in CITED_SECTION.finditer(text):
            doc, section = match.group(1), " ".join(match.group(2).split())
            headings = {
                " ".join(h.replace("`", "").split())
                for h in HEADING.findall(_without_fences(_text(doc) or ""))
            }
            if section not in headings:
                missing.append(f'{path}:{_line_of(text, match.start())}: {doc} "{section}"')

    assert not missing, f"cited sections that are not headings of their doc: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def _anchors(path: str) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(_without_fences(_text(path) or "")):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(anchors)


def _markdown_files() -> list[str]:
    return [p for p in _repository_files() if p.endswith(".md")]


def test_the_readme_and_every_doc_are_checked():
    files = _markdown_files()

    assert "README.md" in files
    assert {"docs/api.md", "docs/design.md", "docs/operations.md", "docs/performance.md"} <= set(
        files
    )


def test_every_relative_link_in_the_markdown_resolves():
    broken = []
    for path in _markdown_files():
        text = _without_code(_text(path) or "")
        for match in MARKDOWN_LINK.finditer(text):
            target = match.group(1)
            where = f"{path}:{_line_of(text, match.start())}: {target}"
            if URL_SCHEME.match(target):
                continue  # http(s), mailto: not ours to check
            file_part, _, anchor = target.partition("#")
            if file_part:
                base = ROOT if file_part.startswith("/") else (ROOT / path).parent
                resolved = (base / file_part.lstrip("/")).resolve()
                if not resolved.exists():
                    broken.append(f"{where} (no such file)")
                    continue
                if not resolved.is_relative_to(ROOT):
                    broken.append(f"{where} (outside the repository)")
                    continue
                linked = resolved.relative_to(ROOT).as_posix()
            else:
                linked = path
            if anchor and linked.endswith(".md") and anchor not in _anchors(linked):
                broken.append(f"{where} (no heading #{anchor} in {linked})")

    assert not broken, f"broken relative links: {broken}"


# --- 4. no citation of the files outside the repository -------------------------------


def test_nothing_outside_docs_cites_the_shared_files():
    found = []
    for path, text in _text_files():
        if path.startswith("docs/") or path == THIS_FILE:
            continue
        for match in OUTSIDE_CITATION.finditer(text):
            found.append(f"{path}:{_line_of(text, match.start())}: {match.group(0)}")

    assert not found, (
        f"cite docs/design.md or docs/api.md instead of the files outside the repository: {found}"
    )
