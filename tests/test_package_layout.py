"""The package's rooms and the direction of their imports (docs/ARCHITECTURE.md, "The rooms").

Each room sits on a layer; a module may import from its own layer or a lower one. A new import
that runs back up, or a new cycle between modules, fails here with the line that made it, so the
map in ARCHITECTURE.md stays the map of the code.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minicb"

# lowest first: the vocabulary every room uses, then the rooms along a request's route, then
# the book's apparatus. `kernels` is the top-level kernels/ folder, installed as minicb.kernels.
LAYERS = [
    {"facts", "repeats", "registry", "params", "metrics", "kernels"},
    {"config", "request", "plan"},
    {"kv", "model"},
    {"runner", "spec"},          # a verification row is sampled by the runner with spec's rule
    {"scheduler"},
    {"engine"},
    {"sim"},                     # the engine's core with the model swapped for a clock
    {"viz"},
    {"serving"},
    {"bench", "tools", "__init__", "__main__"},
]
LAYER = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}

# the one import allowed to run up a layer, and why
ALLOWED_UPWARD = {
    # a type annotation only (under TYPE_CHECKING): the plan carries the runner's per-request
    # logits state through to the runner without the plan's module importing the runner
    ("plan", "runner"),
}

MAX_TOP_LEVEL_MODULES = 10
MAX_CORE_FILE_LINES = 420
CORE_ROOMS = ("engine", "scheduler", "runner", "kv", "spec", "plan", "params", "request",
              "config")
MAX_BENCH_LINES = 6000


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts).removesuffix(".__init__")] = path
    for path in sorted((ROOT / "kernels").glob("*.py")):
        found["minicb.kernels" + ("" if path.stem == "__init__" else "." + path.stem)] = path
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(imported minicb module, line) for every import statement in the file, wherever it sits
    (inside a function or under TYPE_CHECKING too: an import anywhere is a dependency)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            if base == "minicb":
                found += [("minicb." + alias.name, node.lineno) for alias in node.names]
            elif base.startswith("minicb."):
                found.append((base, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names
                      if alias.name.startswith("minicb.")]
    return found


def _front_door() -> dict[str, str]:
    """`from minicb import LLM` reaches the module the package's __init__ takes LLM from."""
    names = {}
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update({"minicb." + alias.name: node.module for alias in node.names})
    return names


def _graph() -> dict[str, list[tuple[str, int]]]:
    modules, front_door = _modules(), _front_door()
    graph = defaultdict(list)
    for module, path in modules.items():
        for target, line in _imports(path, module):
            target = front_door.get(target, target)
            if target not in modules and target.rsplit(".", 1)[0] in modules:
                target = target.rsplit(".", 1)[0]      # a name imported from a module
            graph[module].append((target, line))
    return graph


def test_every_room_has_a_layer():
    rooms = {_room(m) for m in _modules()}
    assert rooms <= set(LAYER), f"rooms without a layer in LAYERS: {sorted(rooms - set(LAYER))}"


def test_imports_run_down_the_layers():
    upward = []
    for module, targets in _graph().items():
        for target, line in targets:
            here, there = _room(module), _room(target)
            if (here != there and LAYER.get(there, -1) > LAYER[here]
                    and (here, there) not in ALLOWED_UPWARD):
                upward.append(f"{_modules()[module].relative_to(ROOT)}:{line} imports {target} "
                              f"({here} is below {there})")
    assert not upward, "imports from a lower layer up to a higher one:\n" + "\n".join(upward)
    assert len(ALLOWED_UPWARD) <= 1


def test_no_import_cycle_between_modules():
    graph = {m: {t for t, _ in targets} for m, targets in _graph().items()}
    # Tarjan's strongly connected components: a component of more than one module is a cycle
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    # a package's __init__ importing its own submodules is how a package is made, not a cycle
    real = [c for c in cycles
            if not all(m.startswith(min(c, key=len) + ".") or m == min(c, key=len) for m in c)]
    assert not real, f"import cycles: {real}"


def test_the_top_level_holds_only_the_vocabulary():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_TOP_LEVEL_MODULES, loose


def test_core_files_stay_readable():
    long = []
    for room in CORE_ROOMS:
        paths = [PACKAGE / f"{room}.py"] if (PACKAGE / f"{room}.py").exists() else \
            sorted((PACKAGE / room).glob("*.py"))
        for path in paths:
            lines = len(path.read_text().splitlines())
            if lines > MAX_CORE_FILE_LINES:
                long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, f"core files over {MAX_CORE_FILE_LINES} lines: {long}"


def test_bench_is_capped_and_runs_in_minicbs_environment():
    total = sum(len(p.read_text().splitlines()) for p in (PACKAGE / "bench").glob("*.py"))
    assert total <= MAX_BENCH_LINES, f"minicb/bench has {total} lines (cap {MAX_BENCH_LINES})"
