"""Print the import graph of the `atlas` package, one line per module, and any cycle in it.

    .venv/bin/python scripts/import_graph.py            # modules and what they import from atlas
    .venv/bin/python scripts/import_graph.py --layers   # the same, folded to subpackages

Imports made only for type checking are left out, as in the layers contract (pyproject.toml).
Exits 1 when there is a cycle between the modules of a package or between subpackages.
"""

from __future__ import annotations

import sys

import grimp


def fold(module: str, layers: bool) -> str:
    """`atlas.core.recall` -> `atlas.core` when folding to subpackages."""
    return ".".join(module.split(".")[:2]) if layers else module


def edges(graph: grimp.ImportGraph, *, layers: bool) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module in sorted(graph.modules):
        source = fold(module, layers)
        out.setdefault(source, set())
        for imported in graph.find_modules_directly_imported_by(module):
            if (target := fold(imported, layers)) not in (source, "atlas"):
                out[source].add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            group.append(node)
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str]) -> int:
    layers = "--layers" in argv
    graph = edges(grimp.build_graph("atlas", exclude_type_checking_imports=True), layers=layers)
    for module, targets in graph.items():
        print(f"{module} -> {', '.join(sorted(targets)) or '-'}")
    loops = cycles(graph) if layers else [c for pkg in {m.rsplit('.', 1)[0] for m in graph}
                                          for c in cycles({m: {t for t in ts if t.rsplit('.', 1)[0] == pkg}
                                                           for m, ts in graph.items() if m.rsplit('.', 1)[0] == pkg})]
    for loop in loops:
        print("cycle:", " <-> ".join(loop))
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(loops)} cycles")
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
