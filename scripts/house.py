#!/usr/bin/env python3
"""The house's shape, checked: import circles among python/tdx's modules
(imports inside functions count: a reader follows them too) and among
lib/'s source files (a.cpp -> b.cpp when a includes the header b.cpp
implements), and source files over the line limit.

    scripts/house.py [--limit 700]      # exits 1 and names what it finds
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("TDX_BUILD_DIR", os.path.join(ROOT, "build"))
SOURCES = (".py", ".cpp", ".cu", ".h", ".td", ".sh")
SOURCE_DIRS = ("python", "lib", "include", "dialects", "passes", "tools", "scripts", "bench",
               "examples", "test")


def python_graph():
    pkg = os.path.join(ROOT, "python", "tdx")
    modules = {f[:-3] for f in os.listdir(pkg) if f.endswith(".py")}
    graph = {}
    for m in modules:
        text = open(os.path.join(pkg, m + ".py")).read()
        deps = set()
        for names in re.findall(r"^\s*from \. import ([\w, ()]+)", text, re.M):
            deps |= {n.split(" as ")[0].strip("() ") for n in names.split(",")}
        deps |= set(re.findall(r"^\s*from \.(\w+)(?:\.\w+)* import", text, re.M))
        deps |= set(re.findall(r"^\s*import tdx\.(\w+)", text, re.M))
        graph["python/tdx/" + m + ".py"] = {"python/tdx/" + d + ".py" for d in deps
                                           if d in modules and d != m}
    return graph


def cpp_graph(build):
    """lib/ source -> the lib/ sources defining a symbol it uses, read off
    their objects in `build` (nm: what an object leaves undefined against
    what another defines strongly; inline and template code, defined weakly
    everywhere, ties no one)."""
    import subprocess
    defined, used = {}, {}
    for d, dirs, files in os.walk(build):
        # Another build inside this one (build/wheel) is not this build.
        dirs[:] = [x for x in dirs if not os.path.exists(os.path.join(d, x, "CMakeCache.txt"))]
        for f in files:
            if not f.endswith(".o") or "CMakeFiles" not in d:
                continue
            path = os.path.join(d, f)
            source = _lib_source(path)
            if source is None:
                continue
            out = subprocess.run(["nm", path], capture_output=True, text=True).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "U":
                    used.setdefault(source, set()).add(parts[1])
                elif len(parts) == 3 and parts[1] in "TDBR":
                    defined.setdefault(source, set()).add(parts[2])
    owner = {}
    for source, names in defined.items():
        for n in names:
            owner.setdefault(n, set()).add(source)
    graph = {s: set() for s in set(defined) | set(used)}
    for source, names in used.items():
        for n in names:
            graph[source] |= owner.get(n, set()) - {source}
    return graph


def _lib_source(obj):
    """lib/X/Y.cpp of an object build/.../CMakeFiles/T.dir/[__/lib/]X/Y.cpp.o
    (its target's folder lib/... when the object holds no lib/ path)."""
    if ".dir/" not in obj:
        return None
    head, tail = obj.split(".dir/", 1)
    tail = tail[:-2]
    if "lib/" in tail:
        rel = "lib/" + tail.split("lib/", 1)[1]
    else:
        folder = os.path.relpath(head.split("/CMakeFiles/")[0], BUILD)
        rel = os.path.join(folder, tail)
    return rel if os.path.exists(os.path.join(ROOT, rel)) and rel.startswith("lib/") else None


def circles(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def long_files(limit):
    out = []
    for top in SOURCE_DIRS:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(SOURCES):
                    p = os.path.join(d, f)
                    n = sum(1 for _ in open(p, errors="replace"))
                    out.append((n, os.path.relpath(p, ROOT)))
    return sorted(out, reverse=True), [x for x in out if x[0] > limit]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=700, help="most lines a source file keeps to")
    a = ap.parse_args()
    found = 0
    for name, graph in (("python/tdx", python_graph()), ("lib", cpp_graph(BUILD))):
        edges = sum(len(v) for v in graph.values())
        cs = circles(graph)
        print(f"{name}: {len(graph)} files, {edges} dependencies, {len(cs)} import circles")
        for c in cs:
            print("  circle: " + " <-> ".join(c))
        found += len(cs)
    every, over = long_files(a.limit)
    print(f"largest source file: {every[0][1]} ({every[0][0]} lines)")
    for n, p in sorted(over, reverse=True):
        print(f"  over {a.limit} lines: {p} ({n})")
    return 1 if found or over else 0


if __name__ == "__main__":
    sys.exit(main())
