"""The shape of the code base, checked: the layers and import rules
(``lint-imports``, contracts in pyproject.toml), no import cycle between
modules, no import hidden in a function without a reason, and an outbox
routing table that covers every topic."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from purchases.apps import check_outbox_routing
from purchases.saga.topics import Topic

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "config",
    "common",
    "ledger",
    "outbox",
    "payments",
    "purchases",
    "webhooks",
    "organizers",
    "accounts",
    "seller",
    "stripe_events",
    "door",
)


def test_the_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(module):
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_between_modules():
    assert _cycles(grimp.build_graph(*PACKAGES)) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    assert _cycles(graph) == [["a", "b", "c"]]


def _hidden_in(source: str) -> list[int]:
    """Lines of imports inside a function that do not say why (a comment on
    their line or the line above)."""
    lines = source.splitlines()
    hidden = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    line = lines[inner.lineno - 1]
                    above = lines[inner.lineno - 2].strip() if inner.lineno > 1 else ""
                    if "#" not in line and not above.startswith("#"):
                        hidden.append(inner.lineno)
    return sorted(set(hidden))


def test_no_import_hides_in_a_function_without_a_reason():
    hidden = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
        for line in _hidden_in(path.read_text())
    ]
    assert hidden == []


def test_the_scan_finds_a_hidden_import_and_accepts_a_reason():
    source = (
        "def a():\n    import os\n"
        "def b():\n    # psycopg is optional here\n    import psycopg\n"
        "def c():\n    from x import y  # a cycle otherwise\n"
    )
    assert _hidden_in(source) == [2]


@pytest.mark.django_db
def test_every_topic_is_routed_and_every_consumer_imports(settings):
    assert check_outbox_routing() == []

    settings.OUTBOX_CONSUMERS = {
        **{t: c for t, c in settings.OUTBOX_CONSUMERS.items() if t != Topic.CONFIRMED},
        Topic.CANCELLED: ["purchases.consumers.no_such_consumer"],
    }
    assert sorted((e.id for e in check_outbox_routing()), key=str) == [
        "purchases.E001",
        "purchases.E002",
    ]


# No product function over this many lines, from its def to its last line
# (issue 31): a function that needs more is two things.
LONGEST_FUNCTION = 60


def _long_functions(source: str) -> list[tuple[str, int]]:
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]


def test_the_length_check_finds_a_long_function():
    body = "".join(f"    x{n} = {n}\n" for n in range(LONGEST_FUNCTION))
    assert _long_functions(f"def short():\n    pass\n\n\ndef long():\n{body}") == [
        ("long", LONGEST_FUNCTION + 1)
    ]


def test_no_product_function_is_longer_than_the_limit():
    long = [
        f"{path.relative_to(ROOT)}: {name} ({lines} lines)"
        for package in (*PACKAGES, "shop")
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
        for name, lines in _long_functions(path.read_text())
    ]
    assert long == []


# One database engine (issue 31): PostgreSQL in production, in the tests and
# under make run, so no code asks which engine it runs on and nothing names
# another one. Migrations included: they run on the same database.
def _second_engine(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "vendor":
            found.append(f"line {node.lineno}: .vendor")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "sqlite" in node.value.lower()
        ):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_the_engine_check_finds_a_vendor_branch_and_a_sqlite_setting():
    source = (
        "from django.db import connection\n"
        "if connection.vendor != 'postgresql':\n"
        "    ENGINE = 'django.db.backends.sqlite3'\n"
    )
    assert _second_engine(source) == [
        "line 2: .vendor",
        "line 3: 'django.db.backends.sqlite3'",
    ]


def test_product_code_knows_one_database_engine():
    found = [
        f"{path.relative_to(ROOT)} {where}"
        for package in (*PACKAGES, "shop")
        for path in sorted((ROOT / package).rglob("*.py"))
        for where in _second_engine(path.read_text())
    ]
    assert found == []
