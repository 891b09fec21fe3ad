#!/usr/bin/env python3
"""The layering rule of DESIGN.md: data flows one way, so a file never includes a header of a higher
layer, and no headers include each other in a cycle. Run by ctest (`layering`); prints each
offending include as file:line and exits 1."""
import pathlib
import re
import sys

# Lowest first; files of one rank may include each other (the two backends are siblings).
LAYERS = [
    ("include/fdpp", 0), ("core", 0), ("io", 1), ("tokenizer", 2), ("grammar", 3), ("model", 3), ("attention", 4),
    ("engine", 5), ("backend/cpu", 6), ("backend/cuda", 6), ("runtime", 7), ("server", 8),
]
TOP = 9  # front ends: tools/fdpp (the CLI), python/src (the extension)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".inc")


def rank_of_header(name):
    """The layer of an include path as written ("engine/engine.h", "fdpp/error.h"), or None."""
    if name.startswith("fdpp/"):
        return 0
    for prefix, rank in LAYERS:
        if name.startswith(prefix + "/"):
            return rank
    return None


def rank_of_file(root, path):
    rel = path.relative_to(root).as_posix()
    if rel.startswith("include/fdpp/"):
        return 0
    if rel.startswith("src/"):
        return rank_of_header(rel[len("src/"):])
    return TOP


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    files = [p for d in ("src", "include", "tools", "python/src") for p in (root / d).rglob("*")
             if p.suffix in SOURCES]
    problems = []
    graph = {}
    for path in files:
        own = rank_of_file(root, path)
        rel = path.relative_to(root).as_posix()
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = rank_of_header(m.group(1))
            if own is not None and target is not None and target > own:
                problems.append(f"{rel}:{lineno}: includes {m.group(1)} (a higher layer)")
            if rel.startswith("src/") and path.suffix in (".h", ".cuh"):
                graph.setdefault(rel[len("src/"):], []).append(m.group(1))
    # Header cycles (a includes b includes ... a).
    state = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                problems.append("include cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in list(graph):
        if node not in state:
            visit(node, [node])
    for p in problems:
        print(p)
    print(f"layering: {len(files)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
