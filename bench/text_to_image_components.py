"""Each text-to-image component against eager PyTorch: the T5 encoder, the transformer (one
call: one denoising step is two) and the VAE decoder, at each image size, on each thread
count, in float32, as a bfloat16 model (the module converted with .to(torch.bfloat16), against
eager in bfloat16), and with each weight variant the pipeline compiles (transformer bf16, q8,
q6, q4; T5 q8; against eager float32, the model they come from).

    .venv/bin/python bench/text_to_image_components.py                       # medium, minutes
    .venv/bin/python bench/text_to_image_components.py --config wide --sizes 256,512 --threads 1,2

The model is a random one of chroma.pipelines.random_model's configs (medium by default; wide:
Chroma1-HD's widths at 2 double and 4 single blocks, T5-XXL's at 2 layers, the real VAE), or
--model DIR. Eager runs diffusers'/transformers' own modules loaded with from_pretrained, under
torch.no_grad(), torch.set_num_threads(threads); Chroma runs the pipeline's own artifacts
(chroma.pipelines.artifacts.ArtifactStore: the same compile, cached) loaded with that many
threads, and the bfloat16 models compiled with chroma.compile. Each cell: the median of
--calls calls after one warm-up. The text is the pipeline's 64-token bucket. Target (issue:
"faster than eager on every component at every size, at 1 and 2 threads"): every ratio
eager / Chroma above 1, printed as met / NOT met per row.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

TEXT_LEN = 64


def median_s(fn, calls: int) -> float:
    fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def eager_module(model_dir: str, comp: str):
    """One component with its weights (diffusers' or transformers' class, from_pretrained)."""
    from diffusers import AutoencoderKL, ChromaTransformer2DModel
    from transformers import T5EncoderModel

    cls = {"text_encoder": T5EncoderModel, "transformer": ChromaTransformer2DModel, "vae": AutoencoderKL}[comp]
    return cls.from_pretrained(os.path.join(model_dir, comp)).eval()


def inputs(comp: str, size: int, config=None):
    """The example inputs the pipeline's builders make (chroma.pipelines.artifacts)."""
    import torch

    from chroma.pipelines.components import KEY_MASKED

    g = torch.Generator().manual_seed(0)
    if comp == "text_encoder":
        ids = torch.zeros(1, TEXT_LEN, dtype=torch.int64)
        ids[0, : TEXT_LEN // 2] = torch.arange(3, 3 + TEXT_LEN // 2)
        mask = torch.zeros(1, TEXT_LEN, dtype=torch.int64)
        mask[0, : TEXT_LEN // 2] = 1
        return ids, mask
    if comp == "transformer":
        h2 = w2 = size // 16
        lat = torch.randn(1, h2 * w2, config.in_channels, generator=g)
        text = 0.1 * torch.randn(1, TEXT_LEN, config.joint_attention_dim, generator=g)
        bias = torch.zeros(1, TEXT_LEN)
        bias[:, TEXT_LEN // 2:] = KEY_MASKED
        return lat, torch.full((1,), 0.5), text, bias
    return (torch.randn(1, config.latent_channels, size // 8, size // 8, generator=g),)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a model directory (default: a random one of --config)")
    ap.add_argument("--config", choices=("medium", "wide"), default="medium")
    ap.add_argument("--cache", default=None, help="the compiled components' cache (default: beside the model)")
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--components", default="text_encoder,transformer,vae")
    ap.add_argument("--variants", default="bf16,q8,q6,q4", help="the transformer's weight variants (T5: q8)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import numpy as np
    import torch

    import chroma
    from chroma.arrays import to_numpy
    from chroma.pipelines.artifacts import ArtifactStore
    from chroma.pipelines.components import Denoiser, TextEncoder, VaeDecoder
    from chroma.pipelines.memory import t5_rules, transformer_rules
    from chroma.pipelines.model_dir import ModelDir

    work = tempfile.mkdtemp(prefix="chroma-t2i-components-")
    if a.model is None:
        from chroma.pipelines import random_model

        a.model = random_model.write_random_model(os.path.join(work, a.config),
                                                  config=getattr(random_model, a.config.upper()), seed=0)
    a.cache = a.cache or os.path.join(work, "cache")
    model = ModelDir(a.model)
    sizes = [int(s) for s in a.sizes.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    print(f"model {a.model}; {platform.processor() or platform.machine()}, torch {torch.__version__}; median of "
          f"{a.calls} calls, seconds")
    print(f"{'component':12} {'size':>5} {'thr':>3} {'system':26} {'eager s':>9} {'chroma s':>9} {'x eager':>8}  target")

    def report(comp, size, t, system, eager, ours, err=None):
        ratio = eager / ours
        row = {"component": comp, "size": size, "threads": t, "system": system, "eager_s": eager, "chroma_s": ours,
               "speedup": ratio, "rel_l2": err}
        rows.append(row)
        if a.json:  # written after every row: a run cut short keeps what it measured
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump({"model": a.model, "calls": a.calls, "rows": rows}, f, indent=1)
        print(f"{comp:12} {size:5d} {t:3d} {system:26} {eager:9.4f} {ours:9.4f} {ratio:8.2f}  "
              f"{'met' if ratio > 1 else 'NOT met'}" + ("" if err is None else f"  (rel L2 {err:.1e})"), flush=True)

    for comp in a.components.split(","):
        base = eager_module(a.model, comp)  # one component's eager weights in memory at a time
        for size in (sizes if comp != "text_encoder" else sizes[:1]):
            if comp == "text_encoder":
                module, shapes, variants = TextEncoder(base).eval(), {"length": TEXT_LEN}, [("q8", t5_rules("q8"))]
            elif comp == "transformer":
                module = Denoiser(base, size // 16, size // 16, TEXT_LEN).eval()
                shapes = {"batch": 1, "h2": size // 16, "w2": size // 16, "length": TEXT_LEN}
                variants = [(v, transformer_rules(v)) for v in a.variants.split(",") if v]
            else:
                module, shapes, variants = VaeDecoder(base).eval(), {"h": size // 8, "w": size // 8}, []
            args = inputs(comp, size, base.config)
            nargs = [x.numpy() for x in args]
            half = None
            for t in threads:
                torch.set_num_threads(t)
                store = ArtifactStore(model, a.cache, threads=t)
                with torch.no_grad():
                    want = module(*args).float().numpy()
                    eager = median_s(lambda: module(*args), a.calls)
                for name, rules in [("fp32", None)] + variants:
                    prog, _ = store.get(comp, rules, shapes)
                    got = np.asarray(prog(*nargs))
                    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                    report(comp, size, t, f"chroma {name} weights", eager, median_s(lambda: prog(*nargs), a.calls), err)
                    del prog
                # The module as a bfloat16 model, against eager in bfloat16.
                m16 = copy.deepcopy(module).to(torch.bfloat16)
                args16 = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in args)
                with torch.no_grad():
                    want16 = m16(*args16).float().numpy()
                    eager16 = median_s(lambda: m16(*args16), a.calls)
                if half is None:
                    half = chroma.compile(m16, args16, out=os.path.join(work, f"{comp}-{size}-bf16model"), threads=t)
                prog16 = chroma.load(half.directory, threads=t)
                n16 = [to_numpy(x) for x in args16]
                got16 = np.asarray(prog16(*n16)).astype(np.float32)
                err16 = float(np.linalg.norm(got16 - want16) / np.linalg.norm(want16))
                report(comp, size, t, "bf16 model (vs eager bf16)", eager16, median_s(lambda: prog16(*n16), a.calls),
                       err16)
                del m16, prog16
                gc.collect()
            del half, module
            gc.collect()
        del base
        gc.collect()
    missed = [r for r in rows if r["speedup"] <= 1]
    print(f"{len(rows) - len(missed)} of {len(rows)} faster than eager" +
          ("" if not missed else ": NOT met for " + "; ".join(f"{r['component']} {r['size']} {r['threads']}T "
                                                              f"{r['system']}" for r in missed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
