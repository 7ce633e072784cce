#!/usr/bin/env python3
"""Checks that the workspace's dependencies are real. Exits 1 with a list
of what is off, 0 when nothing is. Usage: scripts/check_deps.py

- A member's [dependencies] entry is named in its library or binary
  sources; one named only by its tests, benches or examples belongs in
  [dev-dependencies].
- A [dev-dependencies] entry is named somewhere in the member's sources
  (unit tests live in src/), a [build-dependencies] entry in its build
  script.
- Every [workspace.dependencies] entry is inherited by some member.
- No crate a member depends on directly is built in two versions (normal
  and build edges, all features): one socket2, not ours beside tokio's.

"Named" means `name::`, `use name` or `extern crate name` outside `//`
comments, with `name` the crate's name in Rust (the rename key, or the
package name with `-` as `_`). That is what cargo-machete looks for too,
but it checks [dependencies] only and, for a package at the workspace root,
counts its examples. A dependency needed without being named (to link a
native library, to turn on a feature of another crate) is listed, with a
comment saying why, in its Cargo.toml:

    [package.metadata.check-deps]
    ignore = ["name"]
"""
import json
import os
import re
import subprocess
import sys

MAIN_KINDS = {"lib", "rlib", "dylib", "cdylib", "staticlib", "proc-macro", "bin"}
DEV_KINDS = {"test", "bench", "example"}
LINE_COMMENT = re.compile(r"//(?![/!]).*$", re.M)


def cargo(*args):
    return subprocess.run(["cargo", *args], check=True, capture_output=True, text=True).stdout


def sources(pkg, kinds):
    """The .rs files of `pkg`'s targets of these kinds: the tree under each
    target's directory (a target at the package root: that file alone)."""
    root = os.path.dirname(pkg["manifest_path"])
    files = set()
    for t in pkg["targets"]:
        if not kinds & set(t["kind"]):
            continue
        d = os.path.dirname(t["src_path"])
        if os.path.samefile(d, root):
            files.add(t["src_path"])
            continue
        for dirpath, _, names in os.walk(d):
            files.update(os.path.join(dirpath, n) for n in names if n.endswith(".rs"))
    return files


def named(files, crate, cache):
    pat = re.compile(rf"(?<![\w:]){crate}\s*::|\buse\s+(?:::)?{crate}\b|\bextern\s+crate\s+{crate}\b")
    for f in sorted(files):
        if f not in cache:
            with open(f, encoding="utf-8", errors="replace") as fh:
                cache[f] = LINE_COMMENT.sub("", fh.read())
        if pat.search(cache[f]):
            return True
    return False


def workspace_dependency_keys(manifest):
    try:
        import tomllib

        with open(manifest, "rb") as fh:
            return set(tomllib.load(fh).get("workspace", {}).get("dependencies", {}))
    except ImportError:  # Python < 3.11: one `key = ...` line per entry
        keys, inside = set(), False
        with open(manifest, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("["):
                    inside = line.strip() == "[workspace.dependencies]"
                elif inside and (m := re.match(r"([A-Za-z0-9_-]+)\s*=", line)):
                    keys.add(m.group(1))
        return keys


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    meta = json.loads(cargo("metadata", "--no-deps", "--format-version", "1"))
    members = [p for p in meta["packages"] if p["id"] in meta["workspace_members"]]
    lib_name = {
        p["name"]: next((t["name"] for t in p["targets"] if (MAIN_KINDS - {"bin"}) & set(t["kind"])), None)
        for p in members
    }
    problems, cache, direct, inherited = [], {}, set(), set()
    for p in members:
        ignore = set((p.get("metadata") or {}).get("check-deps", {}).get("ignore", []))
        main_src, dev_src = sources(p, MAIN_KINDS), sources(p, DEV_KINDS)
        build_src = sources(p, {"custom-build"})
        for d in p["dependencies"]:
            key = d["rename"] or d["name"]
            inherited.add(key)
            if d["kind"] != "dev":
                direct.add(d["name"])
            if key in ignore:
                continue
            crate = d["rename"] or lib_name.get(d["name"]) or d["name"]
            crate = crate.replace("-", "_")
            where = f"{p['name']} ({os.path.relpath(p['manifest_path'])})"
            if d["kind"] is None:
                if named(main_src, crate, cache):
                    continue
                if named(dev_src, crate, cache):
                    problems.append(f"{where}: `{key}` is used only by tests, benches or examples: a dev-dependency")
                else:
                    problems.append(f"{where}: dependency `{key}` is not used")
            elif d["kind"] == "dev" and not named(main_src | dev_src, crate, cache):
                problems.append(f"{where}: dev-dependency `{key}` is not used")
            elif d["kind"] == "build" and not named(build_src, crate, cache):
                problems.append(f"{where}: build-dependency `{key}` is not used by the build script")
    for key in sorted(workspace_dependency_keys("Cargo.toml") - inherited):
        problems.append(f"Cargo.toml: [workspace.dependencies] `{key}` is inherited by no member")
    versions = {}
    tree = cargo("tree", "--workspace", "--all-features", "-e", "normal,build", "--prefix", "none", "--format", "{p}")
    for line in tree.splitlines():
        f = line.split()
        if len(f) >= 2 and f[1].startswith("v"):
            versions.setdefault(f[0], set()).add(f[1])
    for name in sorted(direct):
        if len(versions.get(name, ())) > 1:
            problems.append(f"`{name}` is built in versions {', '.join(sorted(versions[name]))} (cargo tree -i {name})")
    for msg in problems:
        print(msg)
    if problems:
        print(f"{len(problems)} dependency problem(s); see scripts/check_deps.py")
        return 1
    print(f"dependencies: {len(members)} crates checked, every dependency used, one version of each direct one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
