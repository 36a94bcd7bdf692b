"""gnomon's import graph: no cycles, and the layering of docs/design.md.

The graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` of a gnomon module in every .py under python/gnomon, at module level and
inside functions (a deferred import is still a dependency), relative imports resolved.
``from a import b`` is an edge to ``a.b`` where that is a module, else to ``a``.

Not edges:
- a package ``__init__``'s lazy re-exports, the imports inside its module-level ``__getattr__``
  (PEP 562: ``gnomon.LLM``, ``gnomon.engine.LLM``). They run only when a user reads that
  attribute, and they point from the public facade down to the implementation; counting them
  would make ``gnomon`` (below every layer) import the engine. No gnomon module may import a
  name through them (test_no_module_imports_a_lazy_export), so no dependency hides there.
- names given to ``importlib.import_module`` as strings (the architecture registry, the
  ``gnomon.predict`` lazy exports): they are data, not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "python"
PACKAGE = "gnomon"

# docs/design.md: "Each layer imports only the layers before it: hardware -> ops -> engine ->
# bench -> predict -> dash", with cli.py on top. Below hardware sit the modules that import no
# layer: the package itself (its eager imports are _compiled and _C), the import router, the
# optional-dependency check, the C++ extension, the document reader/writer, the format
# constants and the cost vocabulary. A module not named here is refused by
# test_every_module_has_a_layer.
LAYERS = (
    ("base", ("gnomon", "gnomon._compiled", "gnomon._extras", "gnomon._C", "gnomon.documents",
              "gnomon.formats", "gnomon.costing")),
    ("hardware", ("gnomon.hardware",)),
    ("ops", ("gnomon.ops",)),
    ("engine", ("gnomon.engine",)),
    ("bench", ("gnomon.bench",)),
    ("predict", ("gnomon.predict",)),
    ("dash", ("gnomon.dash",)),
    ("cli", ("gnomon.cli",)),
)
EXTENSIONS = {"gnomon._C"}  # built from csrc/, no .py: a leaf


def _modules() -> dict:
    """``{dotted name: (path, is_package)}`` for every .py under python/gnomon."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _lazy_exports(tree: ast.Module) -> set:
    """The import nodes inside a package ``__init__``'s module-level ``__getattr__``."""
    skip = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            skip.update(id(n) for n in ast.walk(node)
                        if isinstance(n, (ast.Import, ast.ImportFrom)))
    return skip


def _source(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` reads from, relative imports resolved in `package`."""
    if not node.level:
        return node.module
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict:
    """``{module: {gnomon modules it imports}}``."""
    modules = _modules()
    known = set(modules) | EXTENSIONS
    graph = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _lazy_exports(tree) if is_package else set()
        package = name if is_package else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _source(node, package)
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known
                           else source for alias in node.names]
            else:
                continue
            for target in targets:
                # `import gnomon.a.b` names the deepest module that exists
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                if target in known and target != name and target.split(".")[0] == PACKAGE:
                    edges.add(target)
        graph[name] = edges
    return graph


def _all_imports(module: str) -> set:
    """The top-level names of every package `module` imports (gnomon's and others')."""
    path, _ = _modules()[module]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else node.module.split(".")[0])
    return names - {"__future__"}


def find_cycle(graph: dict):
    """One cycle as ``[a, b, ..., a]``, or None."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack = []

    def visit(node):
        colour[node] = grey
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt, black) == grey:
                return stack[stack.index(nxt):] + [nxt]
            if colour.get(nxt) == white:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = black
        return None

    for node in sorted(graph):
        if colour[node] == white:
            found = visit(node)
            if found:
                return found
    return None


def layer_of(module: str):
    """The index in LAYERS of the longest prefix naming `module`, or None."""
    best, depth = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = index, len(prefix)
    return best


def test_the_graph_sees_imports_of_every_kind():
    graph = import_graph()
    assert "gnomon.engine.models" in graph["gnomon.engine.config"]  # from . import models
    assert "gnomon.engine.models.layers" in graph["gnomon.engine.models.gpt_oss"]  # from .layers
    assert "gnomon.ops" in graph["gnomon.engine.runner"]  # from gnomon import ops
    assert "gnomon._C" in graph["gnomon.ops.mxfp4"]  # the extension
    assert "gnomon.engine.runner" in graph["gnomon.engine.launch"]  # inside a method
    assert "gnomon.ops" in graph["gnomon.engine.random_weights"]  # inside a function
    assert "gnomon.engine" not in graph["gnomon"]  # a lazy re-export is not an edge
    cycle = find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle == ["a", "b", "c", "a"]


def test_the_shard_arithmetic_and_the_format_constants_need_nothing():
    """`gnomon.formats` imports nothing; `gnomon.engine.parallel` (which the predictor uses)
    imports no torch and no process plumbing; an architecture module takes its format constants
    from `gnomon.formats`, not from the process module."""
    graph = import_graph()
    assert _all_imports("gnomon.formats") == set()
    assert "torch" not in _all_imports("gnomon.engine.parallel")
    assert graph["gnomon.engine.parallel"] == {"gnomon.formats"}
    for module in graph:
        if module.startswith("gnomon.engine.models"):
            assert "gnomon.engine.distributed" not in graph[module], module


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle among gnomon modules: {cycle}"


def _bound_names(tree: ast.Module) -> set:
    """The names a module binds at its top level (not those its ``__getattr__`` makes)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def test_no_module_imports_a_lazy_export():
    """``from <gnomon package> import X`` names a submodule or a name the package's
    ``__init__`` binds, never one only its lazy ``__getattr__`` gives: the graph would not see
    what that import depends on."""
    modules = _modules()
    known = set(modules) | EXTENSIONS
    bound = {name: _bound_names(ast.parse(path.read_text(encoding="utf-8")))
             for name, (path, is_package) in modules.items() if is_package}
    lazy = []
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _source(node, package)
            if source in bound and source != name:
                lazy += [f"{name}: from {source} import {a.name}" for a in node.names
                         if f"{source}.{a.name}" not in known and a.name not in bound[source]]
    assert not lazy, "imports of a package's lazy exports (import the defining module):\n" + \
        "\n".join(lazy)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"


def test_layering():
    names = [layer for layer, _ in LAYERS]
    broken = sorted(f"{module} ({names[layer_of(module)]}) imports {target} "
                    f"({names[layer_of(target)]})"
                    for module, targets in import_graph().items() for target in targets
                    if layer_of(target) > layer_of(module))
    assert not broken, "imports from a later layer:\n" + "\n".join(broken)
