"""docs/architecture.md's reading path is true of the imports: each module it lists imports only modules listed
before it, every module is listed, and the longest chain of imports (the package's floors) stays short.

Imports are read from the source (every `import` statement, those inside functions too: a lazy import is still a
dependency a reader meets), so the test needs neither CuPy nor any optional extra."""
import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minibp"
MOST_FLOORS = 16  # the longest import chain, modules counted; issue 64 brought it from 19


def module_name(path):
    """minibp/run/config.py -> minibp.run.config; minibp/io/__init__.py -> minibp.io."""
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules():
    return {module_name(p.relative_to(ROOT)): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name, path, modules):
    """The package's modules that module `name` imports: `from . import x` names module x, not the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules]
            found.update(submodules)
            if source in modules and len(submodules) < len(node.names):
                found.add(source)
    found.discard(name)
    return found


def import_graph():
    modules = package_modules()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def reading_order():
    """The modules in the order docs/architecture.md's "Reading path" first names them (as minibp/....py)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Reading path", 1)[1].split("\n## ", 1)[0]
    order = []
    for path in re.findall(r"`(minibp/[\w/]+\.py)`", section):
        if module_name(path) not in order:
            order.append(module_name(path))
    return order


def test_reading_path_lists_every_module_that_imports_or_is_imported():
    graph = import_graph()
    order = reading_order()
    assert set(order) <= set(graph), f"listed but not in the package: {sorted(set(order) - set(graph))}"
    silent_packages = {m for m, p in package_modules().items() if p.name == "__init__.py" and not graph[m]}
    missing = set(graph) - set(order) - silent_packages
    assert not missing, f"docs/architecture.md's reading path does not list {sorted(missing)}"


def test_each_module_imports_only_modules_listed_before_it():
    graph = import_graph()
    order = reading_order()
    place = {name: i for i, name in enumerate(order)}
    late = [f"{name} imports {other}, listed after it" for name in order
            for other in sorted(graph[name]) if place.get(other, -1) > place[name]]
    assert not late, "\n".join(late)


def test_floors():
    graph = import_graph()

    @functools.lru_cache(maxsize=None)
    def floor(name, seen=()):
        assert name not in seen, f"an import cycle: {' -> '.join(seen + (name,))}"
        return 1 + max((floor(other, seen + (name,)) for other in graph[name]), default=0)

    deepest = max(graph, key=floor)
    chain, name = [deepest], deepest
    while graph[name]:
        name = max(graph[name], key=floor)
        chain.append(name)
    assert floor(deepest) <= MOST_FLOORS, f"{floor(deepest)} floors: {' -> '.join(chain)}"


def test_the_graph_reader_sees_relative_and_lazy_imports(tmp_path):
    """The reader the tests above stand on: `from . import x`, `from .x import y`, `from .. import z` and an import
    inside a function each name the module they load."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/__init__.py"):
        (package / name).write_text("")
    (package / "sub" / "c.py").write_text("from .. import a\nfrom ..b import thing\n\ndef f():\n    import pkg.a\n")
    (package / "d.py").write_text("from . import a, b\nfrom .sub import c\nfrom . import missing_name\n")
    modules = {module_name(p.relative_to(tmp_path)): p for p in package.rglob("*.py")}
    assert imports("pkg.sub.c", package / "sub" / "c.py", modules) == {"pkg.a", "pkg.b"}
    assert imports("pkg.d", package / "d.py", modules) == {"pkg.a", "pkg.b", "pkg.sub.c", "pkg"}


# ----------------------------------------------------------------------------- tests/ mirrors minibp/

TESTS = ROOT / "tests"


def own_test_file(module_path):
    """minibp/run/config.py -> tests/run/test_config.py; minibp/__init__.py has none of its own."""
    relative = Path(module_path).relative_to("minibp")
    return TESTS / relative.parent / f"test_{relative.stem}.py"


def test_every_module_has_its_test_file_or_a_line_in_conftest():
    from conftest import COVERED_BY
    graph = import_graph()
    modules = [str(p.relative_to(ROOT)) for p in package_modules().values()]
    silent = [m for m in modules if Path(m).name == "__init__.py" and not graph[module_name(m)]]  # a folder's name
    lacking = [m for m in modules if m not in silent and not own_test_file(m).exists() and m not in COVERED_BY]
    assert not lacking, f"no tests/.../test_X.py and no line in conftest.py's COVERED_BY: {lacking}"
    for module, covering in COVERED_BY.items():
        assert (ROOT / module).exists(), f"COVERED_BY names {module}, which is gone"
        assert (TESTS / covering).exists(), f"COVERED_BY says {covering} covers {module}; there is no such file"
        assert not own_test_file(module).exists(), f"{module} has its own test file: its COVERED_BY line is stale"


def test_every_test_file_stands_where_its_module_does():
    """A test file in a subfolder mirrors a module there (tests/io/test_X.py: minibp/io/X.py), so that the
    folders never hold a file that belongs elsewhere; at the top, theme files (test_reliability.py) are welcome."""
    stray = [str(p.relative_to(TESTS)) for p in TESTS.glob("*/test_*.py")
             if not (PACKAGE / p.parent.name / f"{p.stem[5:]}.py").exists()
             and not (p.parent.name == "layers" and p.stem in ("test_bn_layout", "test_layers"))]
    assert not stray, f"test files in a package's folder with no module of that name: {stray}"


def test_no_test_imports_a_private_name():
    """Tests use what a module offers: an import of a name that starts with `_` (or an attribute of a minibp module
    read that way) would tie them to what the module may change freely."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "") != "__future__":
                found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_")]
                if (node.module or "").startswith("minibp"):
                    imported.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("minibp"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in imported:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
