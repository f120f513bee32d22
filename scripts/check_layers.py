#!/usr/bin/env python3
"""Checks the compiler's layering: every #include "..." in src/ names a header of the file's
own layer, of a layer it may include, or a runtime header its layer may use. The build runs it
(CMakeLists.txt, target chroma_layers) before any layer compiles, so an inversion fails the
build; `python3 scripts/check_layers.py src LAYER...` runs it by hand.

LAYER: "folder:folders it may include" (as CHROMA_LAYERS in CMakeLists.txt lists them). A
file's layer is its folder under src/ (codegen/cpu and codegen/gpu are layers of their own);
files directly in src/ (the pipeline) may include everything.

The runtime headers (include/chroma): the shared ones (chroma.h, half.h, elementwise.def,
linalg_kinds.h, detail/) anywhere; the CPU runtime's (chroma/cpu/) only where the CPU's
arithmetic is shared or emitted (interp, codegen/cpu, targets); the GPU runtimes' (chroma/cuda,
chroma/metal, chroma/simt) only in targets.
"""

from __future__ import annotations

import os
import re
import sys

SHARED = ("chroma/chroma.h", "chroma/half.h", "chroma/elementwise.def", "chroma/linalg_kinds.h", "chroma/detail/")
RUNTIME = {"chroma/cpu/": ("interp", "codegen/cpu", "targets"),
           "chroma/cuda/": ("targets",), "chroma/metal/": ("targets",), "chroma/simt/": ("targets",)}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(rel: str, layers: dict) -> str:
    """The layer of a path under src/ ('' for the files directly in src/)."""
    parts = rel.split("/")
    if len(parts) == 1:
        return ""
    two = "/".join(parts[:2])
    return two if two in layers else parts[0]


def check(src: str, specs: list) -> list:
    layers = {}
    for spec in specs:
        name, _, deps = spec.partition(":")
        layers[name] = set(deps.split())
    errors = []
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith((".cpp", ".h", ".def")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            layer = layer_of(rel, layers)
            if layer and layer not in layers:
                errors.append(f"src/{rel}: its folder '{layer}' is not a layer (add it to CHROMA_LAYERS)")
                continue
            with open(path, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc.startswith("chroma/"):
                        if inc.startswith(SHARED):
                            continue
                        users = next((u for p, u in RUNTIME.items() if inc.startswith(p)), None)
                        if users is not None and layer and layer not in users:
                            errors.append(f"src/{rel}:{lineno}: includes the runtime header {inc}, which only "
                                          f"{', '.join(users)} may use")
                        continue
                    if "/" not in inc or not layer:
                        continue  # a header of its own folder, or the pipeline (top)
                    target = layer_of(inc, layers)
                    if target == layer or target in layers[layer]:
                        continue
                    if target == "":
                        errors.append(f"src/{rel}:{lineno}: includes {inc}, the pipeline above every layer")
                    else:
                        errors.append(f"src/{rel}:{lineno}: layer '{layer}' includes {inc} of layer '{target}', which "
                                      f"it may not (it may include: {', '.join(sorted(layers[layer])) or 'nothing'})")
    return errors


def main(argv: list) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    errors = check(argv[1], argv[2:])
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
