"""The package's modules import each other without cycles (function-level imports count too)."""
import ast
import os

ROOT = os.path.join(os.path.dirname(__file__), "..")
PACKAGE_DIRS = {"atgrpo_jax": os.path.join(ROOT, "atgrpo_jax"), "atgrpo_jax.envs": os.path.join(ROOT, "envs")}


def modules() -> dict[str, str]:
    """Module name -> file, for every module of the package (envs/ installs as atgrpo_jax.envs)."""
    out = {}
    for prefix, folder in PACKAGE_DIRS.items():
        for dirpath, _, files in os.walk(folder):
            if prefix == "atgrpo_jax" and os.path.abspath(dirpath).startswith(os.path.abspath(PACKAGE_DIRS["atgrpo_jax.envs"])):
                continue
            rel = os.path.relpath(dirpath, folder)
            parts = [] if rel == "." else rel.split(os.sep)
            if "__pycache__" in parts or (prefix == "atgrpo_jax" and parts[:1] == ["envs"]):
                continue
            for name in files:
                if name.endswith(".py"):
                    mod = ".".join([prefix, *parts] + ([] if name == "__init__.py" else [name[:-3]]))
                    out[mod] = os.path.join(dirpath, name)
    return out


def imports_of(path: str, module: str, known: set[str]) -> set[str]:
    """The package modules `path` imports anywhere in its body (a `from pkg import mod` counts
    as importing pkg.mod)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # a parent package is not a cycle
                found.add(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycles():
    mods = modules()
    assert "atgrpo_jax.train.loop" in mods and "atgrpo_jax.envs.grid" in mods
    graph = {m: imports_of(path, m, set(mods)) for m, path in mods.items()}
    assert graph["atgrpo_jax.train.loop"] >= {"atgrpo_jax.train.step", "atgrpo_jax.train.start"}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
