#!/usr/bin/env python3
"""Checks that no two modules of a crate import each other. Exits 1 with
the cycles found, 0 when there are none. Usage: scripts/check_cycles.py

A module is a source file (`a.rs` or `a/mod.rs`) under a crate's `src/`.
Module A depends on module B when A's code names a path into B
(`crate::b::X`, `super::b::X`, `use crate::{b::X, ...}`), outside `//`
comments. A module naming its own ancestor or descendant does not count
(a parent declares its children, a child's tests use its parent): the
check is for siblings and cousins, where a cycle means two concepts that
cannot be read, or changed, one without the other. Any cycle, of any
length, is reported with the files it runs through.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE_COMMENT = re.compile(r"//.*$", re.M)
BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)(::\{)?")


def crate_srcs():
    for base in ["."] + [os.path.join("crates", d) for d in sorted(os.listdir(os.path.join(ROOT, "crates")))]:
        src = os.path.join(ROOT, base, "src")
        if os.path.isdir(src):
            yield src


def modules(src):
    """Maps each file of a crate to its module path (a tuple)."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel[-1] == "mod" or (len(rel) == 1 and rel[0] in ("lib", "main")):
                rel = rel[:-1]
            if len(rel) >= 1 and rel[0] == "bin":
                continue
            out[full] = tuple(rel)
    return out


def group_items(text, start):
    """The comma-separated items of the `{...}` group opening at `start`."""
    depth, i, item, items = 1, start, "", []
    while i < len(text) and depth:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        if c == "," and depth == 1:
            items.append(item)
            item = ""
        else:
            item += c
        i += 1
    items.append(item)
    return [re.sub(r"\s+", "", x) for x in items if x.strip()]


def refs(mod, text, known):
    """The modules `mod` names."""
    text = STRING.sub('""', BLOCK_COMMENT.sub("", LINE_COMMENT.sub("", text)))
    out = set()
    for m in PATH.finditer(text):
        head, tail, group = m.group(1), [p for p in m.group(2).split("::") if p], m.group(3)
        # `self` is the module itself, `super` its parent (whether the
        # module is a file or a directory's mod.rs), each further `super`
        # one more step up.
        base = () if head == "crate" else (mod if head == "self" else mod[:-1])
        while head == "super" and tail and tail[0] == "super":
            tail = tail[1:]
            base = base[:-1]
        paths = [tail]
        if group:
            paths = [tail + [p for p in item.split("::") if p] for item in group_items(text, m.end())]
        for p in paths:
            full = tuple(base) + tuple(p)
            best = None
            for k in range(len(full), -1, -1):
                if full[:k] in known:
                    best = full[:k]
                    break
            if best is not None:
                out.add(best)
    return out


def related(a, b):
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def main():
    bad = []
    for src in crate_srcs():
        mods = modules(src)
        known = {m: f for f, m in mods.items()}
        graph = {}
        for f, m in mods.items():
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            graph[m] = {r for r in refs(m, text, known) if not related(m, r)}
        # Cycles: strongly connected components with more than one module.
        index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
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
                    comps.append(comp)

        sys.setrecursionlimit(10000)
        for v in sorted(graph):
            if v not in index:
                visit(v)
        for comp in comps:
            names = sorted(os.path.relpath(known[m], ROOT) for m in comp)
            edges = sorted(
                f"{os.path.relpath(known[a], ROOT)} -> {os.path.relpath(known[b], ROOT)}"
                for a in comp
                for b in graph[a]
                if b in comp
            )
            bad.append(f"cycle through {', '.join(names)}:\n    " + "\n    ".join(edges))
    if bad:
        print("import cycles:\n  " + "\n  ".join(bad))
        return 1
    print("import cycles: none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
