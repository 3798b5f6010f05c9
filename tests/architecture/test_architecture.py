"""The layers hold: pgjournal's packages (and its few top-level modules), then the add-ons, form ONE ordered list
(``ORDER``, bottom first; ARCHITECTURE.md is that list with a paragraph for each) and a module imports only from
its own place and the places below it; no import cycle among pgjournal, projections and spark modules (module
level or inside functions; ``if TYPE_CHECKING:`` imports are annotations only and do not count); the core
``pgjournal`` package imports no add-on; the blocking and asyncio twins carry one name. Read from the source with
``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support.parsing import parse, parse_file, parse_files

pytestmark = pytest.mark.mode_independent

ROOT = Path(__file__).resolve().parents[2]
#: the repository's folders of product code; the add-ons are installed as ``pgjournal.projections`` and
#: ``pgjournal.spark`` (links inside pgjournal/, see ARCHITECTURE.md), so their modules carry that name here too
PACKAGES = ("pgjournal", "projections", "spark")
ADD_ONS = ("pgjournal.projections", "pgjournal.replication", "pgjournal.spark")

#: Bottom first. A package is named ``name/``, a module at pgjournal's top level ``name.py``; the add-ons last.
ORDER = (
    "errors.py",
    "validation.py",
    "codec/",
    "model/",
    "store/",
    "dialects/",
    "runtime/",
    "buckets.py",
    "settings.py",
    "server/",
    "tags/",
    "admin/",
    "core/",
    "write/",
    "state/",
    "query/",
    "journal.py",
    "aio/",
    "faces.py",
    "shards/",
    "entity/",
    "examples/",
    "__init__.py",
    "cli/",
    "__main__.py",
    "metrics.py",
    "transcoding.py",
    "projections/",
    "replication/",
    "spark/",
)
#: asyncio modules without a blocking twin
AIO_ONLY = ("__init__",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] != "pgjournal":
        parts.insert(0, "pgjournal")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, module: str) -> set[str]:
    """Every module name ``path`` imports, with ``from x import y`` as ``x.y`` when y may be a module."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            names.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)

    Visitor().visit(parse_file(path))
    return names


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")
               if not any(p.is_relative_to(ROOT / "pgjournal" / add_on.split(".")[1]) for add_on in ADD_ONS)}
    graph: dict[str, set[str]] = {}
    parse_files(modules.values())  # one child process for them all
    for module, path in modules.items():
        deps = set()
        for name in imported_names(path, module):
            if name in modules and name != module:
                deps.add(name)
        # ``from . import x`` names the package too: it is a dependency only if nothing more specific is
        deps -= {d for d in deps if any(o.startswith(d + ".") for o in deps) and modules[d].name == "__init__.py"}
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_core_imports_no_add_on() -> None:
    def add_on(module: str) -> bool:
        return any(module == a or module.startswith(a + ".") for a in ADD_ONS)

    offending = {module: sorted(d for d in deps if add_on(d)) for module, deps in import_graph().items()
                 if not add_on(module)}
    assert {m: d for m, d in offending.items() if d} == {}


def place(module: str) -> str:
    """The entry of ``ORDER`` a module belongs to."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] + ("/" if (ROOT / "pgjournal" / parts[1]).is_dir() else ".py")


def upward(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's imports of a place above its own in ``ORDER``."""
    rank = {name: i for i, name in enumerate(ORDER)}
    found = {module: sorted(d for d in deps if rank[place(d)] > rank[place(module)]) for module, deps in graph.items()}
    return {module: deps for module, deps in found.items() if deps}


def test_every_module_has_a_place_in_the_order() -> None:
    # a new package or top-level module is placed on purpose: in ORDER and in ARCHITECTURE.md
    assert sorted({place(m) for m in import_graph()} - set(ORDER)) == []


def test_packages_import_only_their_own_place_and_the_places_below() -> None:
    assert upward(import_graph()) == {}


#: Type-only imports of a place above: none. A module types what it takes from a layer above against a Protocol of
#: its own layer (``store.tables.Slicing`` for a dialect, ``codec.transcoding.KeyStore``), or against
#: ``core.journal_core.BlockingCore`` / ``server.face``, never against ``Journal``.
ANNOTATIONS_FROM_ABOVE: set[tuple[str, str]] = set()


def annotation_imports(path: Path) -> set[str]:
    """The pgjournal modules ``path`` imports under ``if TYPE_CHECKING:``."""
    found: set[str] = set()
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            found |= {sub.module for child in node.body for sub in ast.walk(child)
                      if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("pgjournal")}
    return found


def test_no_module_names_a_place_above_in_its_annotations_but_the_known_ones() -> None:
    rank = {name: i for i, name in enumerate(ORDER)}
    core = [p for p in (ROOT / "pgjournal").rglob("*.py")
            if not any(p.is_relative_to(ROOT / "pgjournal" / add_on.split(".")[1]) for add_on in ADD_ONS)]
    parse_files(core)  # one child process for them all
    found = {(module_name(p), target) for p in core for target in annotation_imports(p)
             if place(target) in rank and rank[place(target)] > rank[place(module_name(p))]}
    assert sorted(found - ANNOTATIONS_FROM_ABOVE) == []
    assert sorted(ANNOTATIONS_FROM_ABOVE - found) == []  # gone: take it off the list


def test_architecture_md_is_the_order() -> None:
    headings = re.findall(r"^### `([\w./]+)`", (ROOT / "ARCHITECTURE.md").read_text(), flags=re.MULTILINE)
    assert tuple(headings) == ORDER


def test_twins_of_the_two_faces_are_named_alike() -> None:
    blocking = {m.split(".")[-1] for m in import_graph() if ".aio" not in m}
    aio = {p.stem for p in (ROOT / "pgjournal" / "aio").glob("*.py")} - set(AIO_ONLY)
    assert sorted(aio - blocking) == []


def test_the_checker_sees_a_cycle_an_upward_import_and_a_core_import() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert upward({"pgjournal.store.events": {"pgjournal.write.event_writer", "pgjournal.model.slices"}}) == {
        "pgjournal.store.events": ["pgjournal.write.event_writer"]}
    names = imported_names(ROOT / "pgjournal" / "cli" / "lazy.py", "pgjournal.cli.lazy")
    assert "pgjournal.cli.help" in names and "importlib.metadata" in names  # function-level imports count


def test_test_files_have_unique_names() -> None:
    # pytest imports a test file of a folder without __init__.py by its bare name: two files of one name in
    # two folders stop the whole run at collection
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|TRUNCATE|CREATE|ALTER|DROP|COPY|WITH|LOCK|ANALYZE)\s")


def sql_literals(path: Path) -> list[str]:
    """The string literals (f-strings' text included) of ``path`` that begin as an SQL statement does."""
    found = []
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.match(node.value):
            found.append(f"{path.name}:{node.lineno}: {node.value[:40]!r}")
    return found


def test_the_shards_package_keeps_its_sql_in_the_store() -> None:
    # the sharded journal and the move run the statements of store/shard_layout.py, store/shard_guard.py and
    # store/catalog.py, as the rest of the code runs the store's
    paths = parse_files(sorted((ROOT / "pgjournal" / "shards").glob("*.py")))
    assert [hit for path in paths for hit in sql_literals(path)] == []


def test_the_sql_checker_sees_a_statement_in_an_f_string(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('table = "t"\nconn.execute(f"TRUNCATE {table}")\nprint("select a colour")\n')
    assert sql_literals(module) == ["m.py:2: 'TRUNCATE '"]


def test_every_error_is_a_public_name() -> None:
    # "An error: in pgjournal/errors.py under JournalError, exported from pgjournal/__init__.py" (ARCHITECTURE.md)
    tree, init = parse_files([ROOT / "pgjournal" / "errors.py", ROOT / "pgjournal" / "__init__.py"]).values()
    errors = {node.name for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")}
    public = next(ast.literal_eval(node.value) for node in init.body
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__")
    assert sorted(errors - set(public)) == []


#: The native Spark source's layers, bottom first (ARCHITECTURE.md, Add-ons); ``source`` re-exports their names
#: and is imported by none of them.
SPARK_SOURCE_LAYERS = ("schema", "options", "planning", "filters", "batch", "stream", "datasource", "source")


def test_the_spark_source_layers_import_downward() -> None:
    graph = import_graph()
    rank = {f"pgjournal.spark.{name}": i for i, name in enumerate(SPARK_SOURCE_LAYERS)}
    upward_imports = {module: sorted(d for d in graph[module] if d in rank and rank[d] > rank[module])
                      for module in rank}
    assert {module: deps for module, deps in upward_imports.items() if deps} == {}


def _main_guard_last(tree: ast.Module) -> bool:
    """``if __name__ == "__main__":`` is the module's last statement, if it has one: ``python -m`` runs it when
    it is reached, before anything below it is defined."""
    guards = [i for i, node in enumerate(tree.body) if isinstance(node, ast.If)
              and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"']
    return all(i == len(tree.body) - 1 for i in guards)


def test_nothing_is_defined_below_a_main_guard() -> None:
    trees = parse_files(p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py")))
    late = [str(p.relative_to(ROOT)) for p, tree in trees.items() if not _main_guard_last(tree)]
    assert late == []


def test_the_main_guard_checker_sees_a_function_below_it() -> None:
    assert not _main_guard_last(parse('if __name__ == "__main__":\n    main()\n\ndef helper():\n    pass\n'))
    assert _main_guard_last(parse("def helper():\n    pass\n\nif __name__ == '__main__':\n    helper()\n"))
