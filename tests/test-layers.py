#!/usr/bin/env python3
"""The house drawn: files of daemon/, libshared/, client/, tools/ and
include/sinkd/ as nodes, their includes and their calls as arrows.

Fails when
  - an arrow runs from a lower layer to a higher one (LAYERS below, top
    first) or between two groups of the same layer;
  - files form a cycle of includes, or modules (a .c with its .h) a cycle
    of calls (a header that only declares types and shares them is no
    module of its own: including it is no call);
  - a msgpack map or a request is packed outside the wire module
    (libshared/proto/wire*.c), except in the files of PACKS_BY_HAND;
  - an exception listed here no longer happens (so the list stays true).

The includes come from the sources; the calls from the objects of a
build (compile_commands.json names them, `nm` lists their symbols): a
call is an undefined symbol of one object that another defines. Prints
the graph's summary.

Usage: test-layers.py SOURCE_ROOT [BUILD_ROOT]   (no BUILD_ROOT: includes
only)
"""
import json
import os
import re
import subprocess
import sys
from collections import defaultdict

# The layers, top first: a file may include and call files of its own
# group and of the layers below its own, never of another group of its
# layer. A group is named by a folder, and holds the files under the
# paths listed (a folder's, or files that sit apart from their folder's).
LAYERS = [
    [("tools", ["tools"])],
    [("client", ["client"]),
     ("daemon", ["daemon/main.c", "daemon/startup.c", "daemon/startup.h", "daemon/config.c",
                 "daemon/config.h", "daemon/modelwait.c", "daemon/modelwait.h"])],
    [("daemon/http", ["daemon/http"])],
    [("daemon/server", ["daemon/server"])],
    [("daemon/net", ["daemon/net"]), ("daemon/session", ["daemon/session"])],
    [("daemon/model", ["daemon/model"])],
    [("daemon/base", ["daemon/base", "daemon/sk_limits.h"])],
    [("libshared/libsinkd", ["libshared/libsinkd"])],
    [("libshared/proto", ["libshared/proto"])],
    [("include/sinkd", ["include/sinkd"])],
]

# Interfaces a layer declares for a higher one to implement (dependency
# inversion): calls from the declaring folder into their implementation
# are allowed, and only those. header -> why.
INTERFACES = {
    "daemon/model/kvstep.h":
        "the forward pass reads a session's KV cache through the functions it "
        "declares; session/kvcache.c implements them, so the model never sees "
        "the cache's layout, header or policies",
}

# Arrows against the rules that are known and must go: (from, to) of
# modules -> why. The check fails when one of them no longer happens.
KNOWN = {}

# Files that still pack msgpack maps or requests by hand -> why.
PACKS_BY_HAND = {}

AREAS = ["daemon", "libshared", "client", "tools", "include/sinkd"]
SOURCE = re.compile(r".*\.(c|h|inc)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Packing a map or a request by hand: a map header, a key/value helper, or
# an "op" key written as a string.
BY_HAND = re.compile(r'msgpack_pack_map\s*\(|sk_pack_kv_\w+\s*\(|sk_msgbuf_finish_map\s*\(|'
                     r'sk_wire_map_begin\s*\(|"op"\s*\)')
GENERATED = {"sk_config.h"}


def layer_of(path):
    """(rank, group) of a source path relative to the root."""
    best = None
    for rank, groups in enumerate(LAYERS):
        for name, prefixes in groups:
            for p in prefixes:
                if (path == p or path.startswith(p + "/")) and (best is None or len(p) > best[2]):
                    best = (rank, name, len(p))
    if best is None:
        sys.exit(f"test-layers: {path} is in no layer: add it to LAYERS")
    return best[:2]


def module_of(path):
    """A .c and its .h are one module (the path without extension), and
    so is a module's internal header X_int.h."""
    return re.sub(r"(_int)?\.(c|h|inc)$", "", path)


def sources(root):
    out = []
    for area in AREAS:
        for dirpath, _, files in os.walk(os.path.join(root, area)):
            for f in files:
                if SOURCE.match(f):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def include_roots(path):
    """Where a file's quoted includes are looked up (as meson sets -I)."""
    area = path.split("/")[0]
    roots = [os.path.dirname(path)]
    if area == "daemon":
        roots += ["daemon", "libshared", "include"]
    elif area == "libshared":
        roots += ["libshared", "include"]
    elif area in ("client", "tools"):
        roots += ["client", "tools", "daemon", "libshared", "include"]
    else:
        roots += ["include"]
    return roots


def includes(root, files):
    known = set(files)
    edges = set()
    for f in files:
        text = open(os.path.join(root, f), encoding="utf-8").read()
        for name in INCLUDE.findall(text):
            if name in GENERATED:
                continue
            for r in include_roots(f):
                cand = os.path.normpath(os.path.join(r, name))
                if cand in known:
                    edges.add((f, cand))
                    break
            else:
                sys.exit(f"test-layers: {f}: cannot find \"{name}\"")
    return edges


def calls(root, build, files):
    """(caller file, callee file, symbol) from the build's objects."""
    db = json.load(open(os.path.join(build, "compile_commands.json")))
    known = set(files)
    objs = {}
    for e in db:
        src = os.path.relpath(os.path.normpath(os.path.join(e["directory"], e["file"])), root)
        if src in known and src not in objs:
            objs[src] = os.path.join(e["directory"], e["output"])
    defined, undefined = {}, defaultdict(set)
    for src, obj in sorted(objs.items()):
        out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            name, kind = parts[0], parts[1]
            if kind == "U":
                undefined[src].add(name)
            elif kind.isupper() and name != "main":
                defined.setdefault(name, src)
    edges = set()
    for src, names in undefined.items():
        for name in names:
            dst = defined.get(name)
            if dst and dst != src:
                edges.add((src, dst, name))
    return edges, len(objs)


def declared_in(root, header, symbol):
    text = open(os.path.join(root, header), encoding="utf-8").read()
    return re.search(r"\b" + re.escape(symbol) + r"\s*\(", text) is not None


def cycles(nodes, edges):
    """The strongly connected components of more than one node (Tarjan)."""
    graph = defaultdict(set)
    for a, b in edges:
        if a != b:
            graph[a].add(b)
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    root = os.path.abspath(sys.argv[1])
    build = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else None
    files = sources(root)
    inc = includes(root, files)
    call_edges, n_objs = calls(root, build, files) if build else (set(), 0)
    problems = []
    seen_known = set()

    def judge(kind, a, b, what):
        ra, ka = layer_of(a)
        rb, kb = layer_of(b)
        ma, mb = module_of(a), module_of(b)
        if ra < rb or (ka == kb):
            return
        if (ma, mb) in KNOWN:
            seen_known.add((ma, mb))
            return
        direction = "up" if ra > rb else "sideways"
        problems.append(f"{kind} {direction}: {a} ({ka}) -> {b} ({kb}){what}")

    for a, b in sorted(inc):
        judge("include", a, b, "")
    # A call into the implementation of an interface the caller's folder
    # declares is an arrow from the implementation to the interface.
    inverted = defaultdict(set)
    mod_edges = set()
    for a, b, sym in sorted(call_edges):
        iface = [h for h in INTERFACES
                 if layer_of(h)[1] == layer_of(a)[1] and declared_in(root, h, sym)]
        if iface and layer_of(a)[0] > layer_of(b)[0]:
            inverted[(iface[0], b)].add(sym)
            mod_edges.add((module_of(b), module_of(iface[0])))
            continue
        judge("call", a, b, f" ({sym})")
        mod_edges.add((module_of(a), module_of(b)))

    # Cycles: of files (includes), and of modules (calls).
    for comp in cycles(files, inc):
        problems.append("include cycle: " + " -> ".join(comp))
    mods = {module_of(f) for f in files}
    for comp in cycles(mods, mod_edges):
        inside = {(x, y) for x in comp for y in comp if x != y and (x, y) in mod_edges}
        if inside <= set(KNOWN):
            seen_known |= inside
            continue
        problems.append("module cycle: " + " <-> ".join(comp))

    # Maps and requests packed by hand.
    by_hand = set()
    for f in files:
        if re.match(r"libshared/proto/wire[^/]*\.c$", f) or not f.endswith(".c"):
            continue
        text = open(os.path.join(root, f), encoding="utf-8").read()
        if BY_HAND.search(text):
            by_hand.add(f)
            if f not in PACKS_BY_HAND:
                line = text[:BY_HAND.search(text).start()].count("\n") + 1
                problems.append(f"packed by hand outside the wire module: {f}:{line}")
    for f in sorted(set(PACKS_BY_HAND) - by_hand):
        problems.append(f"PACKS_BY_HAND lists {f}, which packs nothing by hand: remove it")
    for k in sorted(set(KNOWN) - seen_known):
        problems.append(f"KNOWN lists {k[0]} -> {k[1]}, which no longer happens: remove it")

    # The summary.
    print(f"files {len(files)}, modules {len(mods)}, objects read {n_objs}")
    print(f"arrows: {len(inc)} includes, {len({(a, b) for a, b, _ in call_edges})} "
          f"file-to-file calls ({len(call_edges)} symbols)")
    folder = defaultdict(int)
    for a, b in inc:
        folder[(layer_of(a)[1], layer_of(b)[1])] += 1
    for a, b in {(a, b) for a, b, sym in call_edges
                 if not any(b == impl and sym in syms for (_, impl), syms in inverted.items())}:
        folder[(layer_of(a)[1], layer_of(b)[1])] += 1
    print("layers, top first (a folder's arrows to other folders: includes + calls):")
    for rank, groups in enumerate(LAYERS):
        for key, _ in groups:
            outs = sorted((b, n) for (a, b), n in folder.items() if a == key and b != key)
            text = ", ".join(f"{b} {n}" for b, n in outs) or "-"
            print(f"  {rank} {key}: {text}")
    for (h, impl), syms in sorted(inverted.items()):
        print(f"interface {h} implemented by {impl} ({len(syms)} functions): "
              f"{INTERFACES[h]}")
    for (a, b) in sorted(seen_known):
        print(f"known arrow {a} -> {b}: {KNOWN[(a, b)]}")
    for f in sorted(by_hand & set(PACKS_BY_HAND)):
        print(f"packs by hand: {f}: {PACKS_BY_HAND[f]}")
    if problems:
        print(f"{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    print("no cycles, no arrow up")


main()
