"""No import circles among the project's packages, read from the source: a circle means two modules each need
the other to be loaded, so one of them always runs half-built, and that its shared piece belongs elsewhere.

Every `import` and `from ... import` statement counts, wherever it stands: at module level, in a function
(a circle through a function-level import is still a circle of design) or under `if __name__ == "__main__"`.
Importing `a.b.c` first runs the packages `a` and `a.b`, so those are edges too, except for the importer's
own packages (which have always run before it). Loading by name (importlib, as the registries do) is not an
import statement and is not counted: a registry knows its members by name only.
"""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("collectives", "scaffe", "kernels", "perf")


def modules_of(root, packages):
    """Dotted module name -> source file, for every .py file of `packages` under `root`."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_names(module, path, statement, modules):
    """The dotted names of what one import statement of `module` (its file `path`) loads: for `from m import x`,
    m.x where that is a module, else m (whose code defines x, even where m is the importer's own package)."""
    if isinstance(statement, ast.Import):
        return [alias.name for alias in statement.names]
    base = statement.module or ""
    if statement.level:  # relative: from the module's own package, one level up per extra dot
        package = module.split(".")[:len(module.split(".")) - (path.name != "__init__.py") - statement.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in statement.names]


def _edges_of(name, modules, importer):
    """The project's modules that importing dotted `name` runs, seen from `importer`."""
    while name not in modules and "." in name:  # a submodule that is not in the tree: its package
        name = name.rsplit(".", 1)[0]
    if name not in modules:
        return set()
    parts = name.split(".")
    ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
    return {name} | {p for p in ancestors if p in modules and not (importer + ".").startswith(p + ".")}


def import_graph(root, packages):
    """Module -> the set of project modules its import statements run (see the module docstring)."""
    modules = modules_of(root, packages)
    graph = {}
    for module, path in modules.items():
        targets = set()
        for statement in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                for name in _imported_names(module, path, statement, modules):
                    targets |= _edges_of(name, modules, module)
        graph[module] = targets - {module}
    return graph


def find_circle(graph):
    """One import circle of `graph` as [m0, m1, ..., m0], or None (an iterative depth-first search)."""
    state = {}  # module -> "open" while on the current path, "done" once all it reaches is explored
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_packages_have_no_import_circle():
    circle = find_circle(import_graph(REPO, PACKAGES))
    assert circle is None, "import circle: " + " -> ".join(circle)


def _write(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    _write(tmp_path, {"p/__init__.py": "", "p/a.py": "from p.b import f\n",
                      "p/b.py": "def f():\n    from . import a\n", "p/c.py": "import p.a\n"})
    assert find_circle(import_graph(tmp_path, ["p"])) == ["p.a", "p.b", "p.a"]


def test_a_circle_through_a_package_init_is_found(tmp_path):
    # p.x needs p.q.y, whose package p.q imports p.q.z, which needs p.x.
    _write(tmp_path, {"p/__init__.py": "", "p/x.py": "from p.q.y import g\n", "p/q/__init__.py": "from .z import h\n",
                      "p/q/y.py": "g = 1\n", "p/q/z.py": "from ..x import g\nh = 2\n"})
    graph = import_graph(tmp_path, ["p"])
    assert graph["p.x"] == {"p.q", "p.q.y"} and graph["p.q.z"] == {"p.x"}  # not p: the importer's own package
    assert find_circle(graph) == ["p.q", "p.q.z", "p.x", "p.q"]


def test_imports_in_one_direction_and_by_name_make_no_circle(tmp_path):
    _write(tmp_path, {"p/__init__.py": "import importlib\n", "p/a.py": "import p.b\n",
                      "p/b.py": "import importlib\n\ndef f():\n    return importlib.import_module('p.a')\n"})
    assert find_circle(import_graph(tmp_path, ["p"])) is None
