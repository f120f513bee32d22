"""What the GPU op suites cover, and the sample the guarding tier runs (scripts/test.sh).

The shared op suite runs once per GPU target (CHROMA_TEST_TARGET=webgpu|cuda|metal). The full
tier runs all of it and records, per test, what its compiled programs hold: each kernel kind
("kind:matmul") and each dtype of their inputs, outputs and weights ("dtype:float16"), into
gpu_coverage.json. The guarding tier runs a sample: every test whose name hashes to 0 mod N,
plus, chosen greedily from the record, the fewest further tests that bring the sample's
coverage to the whole suite's; after the run it checks that what the sample's programs held
covers the record's union, item for item.

A case the target refuses (chroma.UnsupportedError at compile time, UnsupportedInput at run
time: conftest.py skips it with the target's reason) is recorded as "refused:<reason>" items
instead. The check fails when a test the record ran is now refused, or is refused for another
reason: a target that starts refusing what it compiled is a regression, not a skip.

    python tests/python/gpu_coverage.py record DIR TARGET   # full tier: DIR's observations -> gpu_coverage.json
    python tests/python/gpu_coverage.py check DIR TARGET    # guarding tier: fails naming what the sample missed

DIR is CHROMA_COVERAGE_DIR, where each pytest process (xdist workers included) writes what its
tests' programs held (conftest.py)."""

from __future__ import annotations

import json
import os
import sys
import zlib
from typing import Dict, Iterable, List, Set

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "gpu_coverage.json")


def items_of(prog) -> Set[str]:
    """What a compiled GPU program holds: its kernels' kinds and its tensors' dtypes."""
    m = getattr(prog, "manifest", None) or {}
    items = {f"kind:{k.get('kind')}" for k in m.get("kernels", []) if isinstance(k, dict)}
    for key in ("inputs", "outputs"):
        items |= {f"dtype:{t.get('dtype')}" for t in m.get(key, []) if isinstance(t, dict)}
    package = getattr(prog, "package", None)
    for d, _ in (getattr(package, "weights", None) or {}).values():
        items.add(f"dtype:{d.get('dtype')}")
    return items


def observed(directory: str) -> Dict[str, Set[str]]:
    """Every test's items, from the processes' files in `directory`."""
    out: Dict[str, Set[str]] = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                for test, items in json.load(f).items():
                    out.setdefault(test, set()).update(items)
    return out


def load_record() -> dict:
    if not os.path.exists(RECORD):
        return {}
    with open(RECORD, encoding="utf-8") as f:
        return json.load(f)


def capabilities(items: Iterable[str]) -> Set[str]:
    """The kernel kinds and dtypes among `items` (refusals aside)."""
    return {i for i in items if not i.startswith("refused:")}


def refusals(items: Iterable[str]) -> Set[str]:
    return {i for i in items if i.startswith("refused:")}


def in_sample(nodeid: str, every: int) -> bool:
    return zlib.crc32(nodeid.encode()) % every == 0


def sample(nodeids: Iterable[str], target: str, every: int) -> Set[str]:
    """The tests the guarding tier runs for `target`: the hash sample, then the greedy
    additions that cover what the record says the whole suite covers."""
    nodeids = list(nodeids)
    chosen = {n for n in nodeids if in_sample(n, every)}
    per_test = {n: capabilities(v) for n, v in load_record().get(target, {}).items() if n in set(nodeids)}
    want = set().union(*per_test.values()) if per_test else set()
    have = set().union(*(per_test.get(n, set()) for n in chosen)) if chosen else set()
    while want - have:
        best = max(sorted(per_test), key=lambda n: len(per_test[n] & (want - have)))
        if not per_test[best] & (want - have):
            break
        chosen.add(best)
        have |= per_test[best]
    return chosen


def main(argv: List[str]) -> int:
    if len(argv) != 4 or argv[1] not in ("record", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    _, mode, directory, target = argv
    seen = observed(directory)
    record = load_record()
    if mode == "record":
        record[target] = {n: sorted(v) for n, v in sorted(seen.items())}
        with open(RECORD, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.write("\n")
        union = set().union(*seen.values()) if seen else set()
        print(f"[coverage] {target}: {len(seen)} tests, {len(union)} kinds and dtypes recorded in {RECORD}")
        return 0
    recorded = record.get(target, {})
    want = set().union(*(capabilities(v) for v in recorded.values())) if recorded else set()
    got = set().union(*(capabilities(v) for v in seen.values())) if seen else set()
    missing = sorted(want - got)
    if not want:
        print(f"[coverage] {target}: no record in {RECORD}: run ./scripts/test.sh --full once", file=sys.stderr)
        return 1
    def said(items):
        return "; ".join(sorted(i[len("refused:"):] for i in refusals(items))) or "ran"

    changed = [f"{n}: now refused ({said(v)}); recorded: {said(recorded[n])}"
               for n, v in sorted(seen.items()) if refusals(v) and n in recorded and refusals(v) != refusals(recorded[n])]
    if changed:
        print(f"[coverage] {target}: the target refuses tests the full tier's record did not (re-record with "
              f"./scripts/test.sh --full if the change is intended):\n  " + "\n  ".join(changed), file=sys.stderr)
        return 1
    if missing:
        print(f"[coverage] {target}: the sample's programs never held {', '.join(missing)}, which the full suite's do "
              f"(gpu_coverage.json); the sampling in tests/python/gpu_coverage.py must cover them", file=sys.stderr)
        return 1
    print(f"[coverage] {target}: the sample ({len(seen)} tests) holds all {len(want)} kernel kinds and dtypes of the "
          f"full suite")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
