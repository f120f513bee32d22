"""What a text-to-image run needs in memory at Chroma1-HD's full size, from the compiler's own
plans (no weights, nothing compiled): the peak of a whole run per transformer variant at the
sizes the MLX port measured, and the largest square image whose run fits a memory budget.

    .venv/bin/python bench/text_to_image_memory.py                       # Chroma1-HD's shapes, T5 q8
    .venv/bin/python bench/text_to_image_memory.py --text-encoder bf16 --budget-gib 16

The model directory is write_shapes_only_model's (Chroma1-HD's configs and safetensors headers
over sparse files). Each component's arena is ArtifactStore.plan's (the component at one block
of each kind with zero weights, exported and lowered: the same temporaries as the whole stack;
docs/text_to_image.md, "Memory"), kept in the cache, so a second run is quick. A run's peak is
its largest stage (weights + arena + library, one component in memory at a time) plus the
arrays the sampling loop keeps; the weights are the compiler's storage arithmetic from the
headers (tests/python/test_text_to_image.py checks it against compiled manifests).

Beside them, the MLX port's measured peaks for its q4 transformer (with an 8-bit T5): 7.09,
7.84, 8.22 and 8.61 GiB at 512, 768x1024, 1024 and 1152 (its text: process peaks, Metal's
allocations included).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
GiB = float(1 << 30)
SEED_Q4 = {(512, 512): 7.09, (768, 1024): 7.84, (1024, 1024): 8.22, (1152, 1152): 8.61}


def needs(pipe, variant: str, w: int, h: int, length: int) -> dict:
    from chroma.pipelines import plan

    plan.plan_arenas_for(pipe, variant, w, h, length, 1)
    return plan.run_needs(pipe, variant, w, h, length, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model directory (default: Chroma1-HD's shapes in --work)")
    ap.add_argument("--work", default=None, help="where the shapes-only model and the plans go (default: a temp dir)")
    ap.add_argument("--sizes", default="512x512,768x1024,1024x1024,1152x1152", help="WxH,... for the peak table")
    ap.add_argument("--variants", default="fp32,bf16,q8,q6,q4")
    ap.add_argument("--text-encoder", default="q8", help="the T5 variant (the MLX port's is 8-bit)")
    ap.add_argument("--length", type=int, default=64, help="the text bucket")
    ap.add_argument("--budget-gib", type=float, default=24.0, help="the memory the largest image must fit in")
    ap.add_argument("--max-side", type=int, default=4096, help="the largest side the search tries")
    a = ap.parse_args()

    from chroma.pipelines import TextToImage
    from chroma.pipelines.random_model import write_shapes_only_model

    work = a.work or tempfile.mkdtemp(prefix="chroma-t2i-memory-")
    model = a.model or os.path.join(work, "Chroma1-HD-shapes")
    if not os.path.isfile(os.path.join(model, "model_index.json")):
        write_shapes_only_model(model)
    pipe = TextToImage(model, cache_dir=os.path.join(work, "cache"), text_encoder=a.text_encoder, quiet=True)
    variants = a.variants.split(",")
    sizes = [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",")]

    print(f"run peak by plan (GiB), T5 {a.text_encoder}, text bucket {a.length}, batch 1 (largest stage + loop arrays)")
    print("| size | " + " | ".join(variants) + " | MLX port q4 (measured) |")
    print("|---|" + "---|" * (len(variants) + 1))
    for w, h in sizes:
        cells = [f"{needs(pipe, v, w, h, a.length)['total'] / GiB:.2f}" for v in variants]
        seed = SEED_Q4.get((w, h))
        print(f"| {w}x{h} | " + " | ".join(cells) + f" | {seed if seed else '-'} |")
    for w, h in sizes[-1:]:
        r = needs(pipe, "q4", w, h, a.length)
        print(f"  q4 at {w}x{h}: {r['detail']}")

    budget = a.budget_gib * GiB

    def fits(v: str, side: int) -> bool:
        try:
            return needs(pipe, v, side, side, a.length)["total"] <= budget
        except Exception as e:  # noqa: BLE001  (a size the compiler refuses does not fit)
            print(f"  ({v} at {side}x{side}: {str(e).splitlines()[0][-160:]})")
            return False

    print(f"\nlargest square image whose run fits {a.budget_gib:g} GiB (sides a multiple of 64 up to {a.max_side}, "
          "by plan):")
    for v in variants:
        lo, hi = 0, a.max_side // 64  # in units of 64 px; lo fits (0: none yet), hi does not
        if fits(v, a.max_side):
            print(f"  {v}: {a.max_side}x{a.max_side} or more")
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(v, 64 * mid):
                lo = mid
            else:
                hi = mid
        if lo == 0:
            r = needs(pipe, v, 64, 64, a.length)
            print(f"  {v}: none (even 64x64 needs {r['total'] / GiB:.2f} GiB: {r['detail']})")
            continue
        r = needs(pipe, v, 64 * lo, 64 * lo, a.length)
        print(f"  {v}: {64 * lo}x{64 * lo}, peak {r['total'] / GiB:.2f} GiB ({r['detail']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
