#!/usr/bin/env python3
"""Fails when a source file includes a header of a later layer (src/README.md).

Layers, each depending only on those before it:
    util -> backend -> engine -> front -> integrations -> tools
Inside the engine, its parts (folders of src/engine/) are layers too, in this order:
    books -> tags -> stats -> streams -> ipc -> pool -> compact -> device -> allocators
and every engine file lies in one of them.
Also: the engine includes no CUDA header. Tests, benchmarks and examples may include
anything. Every header under include/reservoir/ must have a layer here.

    scripts/check-layers.py [--root DIR]   # exit 1 and a line per violation
    scripts/check-layers.py --self-test    # proves the check catches violations
"""
import os
import re
import sys
import tempfile

import check_cli

LAYERS = ["util", "backend", "engine", "front", "integrations", "tools"]
ENGINE_PARTS = ["books", "tags", "stats", "streams", "ipc", "pool", "compact", "device", "allocators"]

# Public headers by layer: the vocabulary below the engine is util.
PUBLIC = {
    "export.hpp": "util", "types.hpp": "util", "config.hpp": "util", "errors.hpp": "util",
    "stats.hpp": "util", "hooks.hpp": "util", "history.hpp": "util", "pools.hpp": "util",
    "sleep.hpp": "util",
    "backend.hpp": "backend", "sim_backend.hpp": "backend", "sim_placement.hpp": "backend",
    "cuda_backend.hpp": "backend", "forwarding_backend.hpp": "backend",
    "segment_source.hpp": "backend",
    "allocator.hpp": "front", "reservoir.h": "front", "version.hpp": "front", "ipc.hpp": "front",
}
SOURCE_DIRS = {"src/util": "util", "src/backend": "backend", "src/engine": "engine",
               "src/front": "front", "src/integrations": "integrations", "tools": "tools"}
CUDA_HEADERS = re.compile(r"^(cuda|cuda_runtime|cuda_runtime_api|cudaTypedefs|nvml)\.h$")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def layer_of_header(name, root):
    """The layer of an included path, or None for system and third-party headers."""
    if name.startswith("reservoir/"):
        base = name[len("reservoir/"):]
        if base not in PUBLIC:
            return "unknown"
        return PUBLIC[base]
    for d, layer in SOURCE_DIRS.items():
        prefix = d[len("src/"):] + "/" if d.startswith("src/") else d + "/"
        if name.startswith(prefix) and os.path.exists(os.path.join(root, d, name[len(prefix):])):
            return layer
    return None


def layer_of_file(rel):
    if rel.startswith("include/reservoir/"):
        return PUBLIC.get(rel[len("include/reservoir/"):], "unknown")
    for d, layer in SOURCE_DIRS.items():
        if rel.startswith(d + "/"):
            return layer
    return None


def engine_part(rel):
    """The engine part (folder under src/engine/) of a path, or None."""
    pieces = rel.split("/")
    if len(pieces) >= 4 and pieces[0] == "src" and pieces[1] == "engine":
        return pieces[2]
    return None


def check(root):
    problems = []
    for top in ["include", "src", "tools"]:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".hpp", ".h", ".cpp", ".cc", ".cu")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                mine = layer_of_file(rel)
                if mine is None:
                    continue
                if mine == "unknown":
                    problems.append(f"{rel}: public header without a layer (add it to "
                                    "scripts/check-layers.py)")
                    continue
                part = engine_part(rel)
                if mine == "engine" and part not in ENGINE_PARTS:
                    problems.append(f"{rel}: an engine file outside the engine's parts "
                                    f"(src/engine/{{{','.join(ENGINE_PARTS)}}}/)")
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for number, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        name = m.group(1)
                        if mine == "engine" and CUDA_HEADERS.match(os.path.basename(name)):
                            problems.append(f"{rel}:{number}: the engine includes a CUDA header ({name})")
                            continue
                        theirs = layer_of_header(name, root)
                        if theirs == "unknown":
                            problems.append(f"{rel}:{number}: {name} has no layer")
                        elif theirs and LAYERS.index(theirs) > LAYERS.index(mine):
                            problems.append(f"{rel}:{number}: {mine} includes {name} ({theirs}, a later layer)")
                        elif mine == "engine" and theirs == "engine":
                            their_part = engine_part("src/" + name)
                            if their_part in ENGINE_PARTS and (
                                    ENGINE_PARTS.index(their_part) > ENGINE_PARTS.index(part)):
                                problems.append(f"{rel}:{number}: engine/{part} includes {name} "
                                                f"(engine/{their_part}, a later part)")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            check_cli.write(root, rel, text)
        write("include/reservoir/allocator.hpp", "#pragma once\n")
        write("include/reservoir/types.hpp", "#pragma once\n")
        write("src/engine/books/good.hpp", '#include "reservoir/types.hpp"\n#include <vector>\n')
        write("src/engine/device/above.hpp", '#include "engine/books/good.hpp"\n')
        assert check(root) == [], check(root)
        write("src/engine/books/bad.hpp", '#include "reservoir/allocator.hpp"\n')
        write("src/engine/books/cuda.cpp", "#include <cuda.h>\n")
        write("src/util/up.hpp", '#include "engine/books/good.hpp"\n')
        write("src/engine/books/part_up.hpp", '#include "engine/device/above.hpp"\n')
        write("src/engine/loose.hpp", "#pragma once\n")
        found = check(root)
        assert any("bad.hpp:1: engine includes reservoir/allocator.hpp" in p for p in found), found
        assert any("CUDA header" in p for p in found), found
        assert any("up.hpp:1: util includes engine/books/good.hpp" in p for p in found), found
        assert any("part_up.hpp:1: engine/books includes engine/device/above.hpp" in p
                   for p in found), found
        assert any("loose.hpp: an engine file outside" in p for p in found), found
        assert len(found) == 5, found
    print("check-layers self-test: ok")
    return 0


def main():
    return check_cli.main(
        __doc__, check, self_test,
        lambda n: f"check-layers: {n} include(s) break the layer order (src/README.md)",
        lambda root: "check-layers: ok")


if __name__ == "__main__":
    sys.exit(main())
