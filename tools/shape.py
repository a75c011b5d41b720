#!/usr/bin/env python3
"""shape.py - the source tree's shape, measured (issue 24): which folder reaches which through
#include and through calls, the arrows that run up the layers (app > api > server > engine >
kernels), the circles between files of different folders, api/ reaching past server/, the
engine touching files, JSON, the environment or the service's libraries, a backend table's
entry tested for NULL by hand instead of through backend_supports, and the longest functions.

  tools/shape.py arrows [--build build]   includes (and, with a build folder, calls: the object
                                          files' defined and undefined symbols); exit 1 on an
                                          upward arrow, a cross-folder circle, an arrow from
                                          api/ past server/, an engine call to those or a
                                          table entry probed outside backend_supports
  tools/shape.py functions [--top 15]     the longest C functions (lines, body included)
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ["kernels", "engine", "server", "api", "app"]  # low to high
CODE = ("app", "api", "server", "engine", "kernels")


def layer(path):
    """the layer index of a tree-relative path (kernels/cpu/x.c is kernels)"""
    top = path.split("/")[0]
    return LAYERS.index(top) if top in LAYERS else None


def sources():
    out = []
    for top in CODE:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".c", ".h", ".cu", ".cuh")):
                    out.append(os.path.relpath(os.path.join(d, f), ROOT))
    return sorted(out)


def module(path):
    """a .c/.cu and its .h are one module: its name without the extension"""
    return re.sub(r"\.(c|h|cu|cuh)$", "", path)


def include_edges(files):
    """(from module, to module) for every #include "x.h" that names a file of the tree"""
    by_name = {}
    for f in files:
        by_name.setdefault(os.path.basename(f), []).append(f)
    edges = set()
    for f in files:
        for line in open(os.path.join(ROOT, f), errors="replace"):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            inc = m.group(1)
            # the including file's folder first, then the tree's folders by name
            here = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            cands = [here] if here in files else [c for c in by_name.get(os.path.basename(inc), [])
                                                  if c.endswith(inc)]
            if cands and module(cands[0]) != module(f):
                edges.add((module(f), module(cands[0]), "include"))
    return edges


# what engine/ never calls: files, the environment, JSON and the service's libraries
ENGINE_FORBIDDEN = re.compile(r"^(getenv|secure_getenv|fopen|fopen64|opendir|cJSON_\w+|"
                              r"sqlite3_\w+|MHD_\w+|curl_\w+|png_\w+|archive_\w+)$")


def call_edges(build, forbidden=None):
    """(from module, to module) for every symbol an object file uses that another defines;
    forbidden (a list) gets (module, symbol) for an engine object using a symbol
    ENGINE_FORBIDDEN names"""
    objs = []
    for d, _, files in os.walk(build):
        for f in files:
            if f.endswith(".o") and "/CMakeFiles/" in os.path.join(d, f):
                src = re.search(r"\.dir/(.+)\.o$", os.path.join(d, f))
                # objects of sources that are gone (a stale build folder) are left out
                if src and layer(src.group(1)) is not None and src.group(1).endswith(".c") and \
                        os.path.exists(os.path.join(ROOT, src.group(1))):
                    objs.append((module(src.group(1)), os.path.join(d, f)))
    defined, used = {}, {}
    for mod, o in objs:
        out = subprocess.run(["nm", o], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBR":
                defined.setdefault(parts[2], mod)
            elif len(parts) == 2 and parts[0] == "U":
                used.setdefault(mod, set()).add(parts[1])
                if forbidden is not None and layer(mod) == 1 and ENGINE_FORBIDDEN.match(parts[1]):
                    forbidden.append((mod, parts[1]))
    edges = set()
    for mod, syms in used.items():
        for s in syms:
            if s in defined and defined[s] != mod:
                edges.add((mod, defined[s], "call"))
    return edges


def entry_names():
    """the backend table's entries (kernels/ops.def)"""
    text = open(os.path.join(ROOT, "kernels", "ops.def")).read()
    return sorted(set(re.findall(r"^BK_(?:TYPED_)?OP\(\w+, (\w+),", text, re.M)))


def probes():
    """(file:line, text) for a backend table entry tested for NULL by hand (if (bk->fn),
    bk->fn &&, !bk->fn, bk->fn ? ...) above kernels/ (and in bench/), where backend_supports
    is the one way to ask (kernels/backend_ops.c)"""
    names = "|".join(entry_names())
    pat = re.compile(r"(?:if\s*\(\s*!?\s*[\w\.\->\(\)]*(?:->|\.)(?:%s)\s*\))|"
                     r"(?:(?:->|\.)(?:%s)\s*(?:&&|\|\||\?|[=!]=\s*NULL))|"
                     r"(?:!\s*[\w\.\->]*(?:->|\.)(?:%s)\b\s*(?!\s*\())" % (names, names, names))
    out = []
    for top in ("app", "api", "server", "engine", "bench"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(d, f)
                for i, line in enumerate(open(path, errors="replace"), 1):
                    if pat.search(line.split("//")[0]):
                        out.append(("%s:%d" % (os.path.relpath(path, ROOT), i), line.strip()))
    return out


def sccs(nodes, adj):
    """Tarjan's strongly connected components"""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def arrows(args):
    files = sources()
    edges = include_edges(files)
    forbidden = []
    if args.build:
        edges |= call_edges(args.build, forbidden)
    up = sorted((a, b, k) for a, b, k in edges if layer(b) > layer(a))
    # api/ reaches the engine only through server/
    past = sorted((a, b, k) for a, b, k in edges
                  if a.startswith("api/") and layer(b) < LAYERS.index("server"))
    adj, nodes = {}, set()
    for a, b, _ in edges:
        adj.setdefault(a, set()).add(b)
        nodes |= {a, b}
    circles = [c for c in sccs(nodes, adj) if len({x.split("/")[0] for x in c}) > 1]
    kinds = "includes and calls" if args.build else "includes"
    print("%d modules, %d arrows (%s)" % (len(nodes), len(edges), kinds))
    print("upward arrows: %d" % len(up))
    for a, b, k in up:
        print("  %s -> %s (%s)" % (a, b, k))
    print("circles across folders: %d" % len(circles))
    for c in circles:
        print("  " + " ".join(c))
    print("arrows from api/ past server/: %d" % len(past))
    for a, b, k in past:
        print("  %s -> %s (%s)" % (a, b, k))
    if args.build:
        print("engine calls to files, env, JSON or service libraries: %d" % len(forbidden))
        for m, sym in sorted(set(forbidden)):
            print("  %s: %s" % (m, sym))
    probed = probes()
    print("table entries probed outside backend_supports: %d" % len(probed))
    for where, text in probed:
        print("  %s: %s" % (where, text))
    return 1 if up or circles or past or forbidden or probed else 0


def functions(args):
    rows = []
    for f in sources():
        if not f.endswith(".c"):
            continue
        lines = open(os.path.join(ROOT, f), errors="replace").read().split("\n")
        start, name = None, None
        for i, line in enumerate(lines):
            if start is None:
                # a definition: its name at column 0 (or after the return type), '{' alone below
                m = re.match(r"^(?:static\s+)?(?:inline\s+)?[A-Za-z_][\w\s\*]*?\b(\w+)\s*\(", line)
                if m and not line.rstrip().endswith(";") and i + 1 < len(lines):
                    for j in range(i, min(i + 8, len(lines))):
                        if lines[j] == "{":
                            start, name = i, m.group(1)
                            break
                        if "{" in lines[j] or lines[j].rstrip().endswith(";"):
                            break  # a one-line body, or a declaration
            elif lines[i] == "}":
                rows.append((i - start + 1, f, name))
                start = None
    rows.sort(reverse=True)
    for n, f, name in rows[: args.top]:
        print("%5d  %s  %s" % (n, f, name))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("arrows")
    a.add_argument("--build", help="a build folder: calls too, from its object files")
    f = sub.add_parser("functions")
    f.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    return arrows(args) if args.cmd == "arrows" else functions(args)


if __name__ == "__main__":
    sys.exit(main())
