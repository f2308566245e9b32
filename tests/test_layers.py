"""The package's layers (ARCHITECTURE.md, "Layers"): a package imports only its own layer and the ones below it,
and no two packages import each other, directly or through others. Read from the source with `ast`, so the lazy
imports inside functions count too; imports under `if TYPE_CHECKING:` never run and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "hunyuan_mt"

#: Bottom to top. A unit is a subpackage of hunyuan_mt or one of its root modules.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "host"),        # what everything may use: the version, typed errors, the machine
    ("text", "kernels"),                   # text with no model in it; our C++ kernels
    ("config",),                           # typed settings (reads text.prompts' family cards)
    ("quant",),                            # int8/4-bit layers and batch-invariant GEMMs
    ("lora",),                             # the PEFT format and the slot layers
    ("decode", "adapters"),                # the decode step and its caches; adapter registry and cache
    ("runtime", "store"),                  # the backbone in memory; the database
    ("scheduler",),                        # engine, tickets, routes, callers' shares
    ("documents",),                        # one reader/writer per format
    ("service",),                          # the facade, document jobs, warm-up, background build
    ("web", "demo", "training"),           # the REST API and page; building the demo; training adapters
    ("serve_ray",),                        # Ray Serve over the web layer and the service
    ("cli", "__main__", "bench", "prebuild"),   # entry points
)
LAYER_OF = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def unit_of(module: str) -> str:
    """hunyuan_mt.scheduler.engine → scheduler; hunyuan_mt.config → config; hunyuan_mt → __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def imports_of(module: str, source: str, is_package: bool, modules: set[str]) -> set[str]:
    """The project modules `module` imports at run time (a `from package import name` names the submodule where
    `name` is one)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    targets: set[str] = set()
    for node in _runtime_imports(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
            continue
        if node.level:
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base.split(".")[0] != PACKAGE:
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            targets.add(sub if sub in modules else base)
    return targets


def project_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    modules = set(paths)
    return {m: imports_of(m, p.read_text(encoding="utf-8"), p.name == "__init__.py", modules)
            for m, p in paths.items()}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            src, dst = unit_of(module), unit_of(target)
            if src not in LAYER_OF or dst not in LAYER_OF:
                bad.append(f"{module} → {target}: {src if src not in LAYER_OF else dst} is in no layer")
            elif LAYER_OF[dst] > LAYER_OF[src]:
                bad.append(f"{module} (layer {LAYER_OF[src]}, {src}) imports {target} (layer {LAYER_OF[dst]}, {dst})")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one node (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                strongconnect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            strongconnect(node)
    return found


def unit_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        src = unit_of(module)
        edges.setdefault(src, set()).update(unit_of(t) for t in targets if unit_of(t) != src)
    return edges


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(m) for m in project_graph()}
    assert sorted(units - set(LAYER_OF)) == []
    assert sorted(set(LAYER_OF) - units) == []


def test_no_import_goes_up_a_layer() -> None:
    assert layer_violations(project_graph()) == []


def test_no_circle_between_packages() -> None:
    assert cycles(unit_edges(project_graph())) == []


def test_no_circle_between_modules() -> None:
    # A package's __init__ importing its own modules is how a package exports; a circle through it is not a
    # dependency between two modules, so the package inits are left out of this one.
    graph = project_graph()
    inits = {m for m in graph if (ROOT / Path(*m.split(".")) / "__init__.py").exists()}
    edges = {m: {t for t in targets if t not in inits} for m, targets in graph.items() if m not in inits}
    assert cycles(edges) == []


def test_the_checks_catch_a_bad_import() -> None:
    # The checker itself, on a made-up tree: text importing the service is reported, and so is a circle.
    modules = {"hunyuan_mt.text.masking", "hunyuan_mt.service.translation", "hunyuan_mt.text"}
    graph = {"hunyuan_mt.text.masking": imports_of("hunyuan_mt.text.masking",
                                                   "from ..service.translation import TranslationService\n",
                                                   False, modules),
             "hunyuan_mt.service.translation": imports_of("hunyuan_mt.service.translation",
                                                          "from ..text import masking\n", False, modules)}
    assert graph["hunyuan_mt.text.masking"] == {"hunyuan_mt.service.translation"}
    assert graph["hunyuan_mt.service.translation"] == {"hunyuan_mt.text.masking"}
    assert layer_violations(graph) == ["hunyuan_mt.text.masking (layer 1, text) imports "
                                       "hunyuan_mt.service.translation (layer 9, service)"]
    assert cycles(unit_edges(graph)) == [["service", "text"]]
    typed = imports_of("hunyuan_mt.text.glossary", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from ..store import GlossaryRows\n", False, {"hunyuan_mt.store"})
    assert typed == set()
