"""The text-to-image pipeline (chroma.pipelines, docs/text_to_image.md) on tiny random models of
Chroma1-HD's architecture written in diffusers' format (chroma.pipelines.random_model).

Tolerances: a compiled component against float32 PyTorch: cosine >= 1 - 1e-6 and max relative
error (max |diff| / max |reference|) <= 1e-5 (float32 rounding in another summation order);
the pipeline's final latents against diffusers' ChromaPipeline given the same embeddings and
noise: max |diff| <= 1e-4 max |reference| (the same rounding carried through the steps); a
bucketed and masked result against the exact-length one: <= 1e-5 relative (padded keys add
exact zeros; only the products' blocking changes). Schedules: bit-exact. The default tier
compiles one T5 bucket, one transformer and one VAE (about 30 s the first time; the model
cache keeps them); the rest is marked `full`.
"""

import fnmatch
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from chroma.pipelines import OFFICIAL_NEGATIVE, TextToImage
from chroma.pipelines import sampling
from chroma.pipelines.model_dir import ModelDir, ModelDirError
from chroma.pipelines.png import read_png_metadata, save_png
from chroma.pipelines.random_model import CHROMA1_HD_SCHEDULER, TINY, write_random_model

PROMPT = "a red fox in snow"
W, H = 64, 64  # 4 x 4 packed tokens


def _quiet_diffusers():
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _quiet_diffusers()
    return write_random_model(str(tmp_path_factory.mktemp("tiny") / "chroma"), seed=0)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("t2i-cache"))


@pytest.fixture(scope="module")
def pipe(tiny, cache):
    return TextToImage(tiny, transformer="fp32", text_encoder="fp32", cache_dir=cache)


def _rel(got, want):
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    return cos, float(np.abs(got - want).max() / np.abs(want).max())


def _diffusers_latents(model, pos, neg, *, seed, width, height, steps, cfg):
    from diffusers import ChromaPipeline

    dp = ChromaPipeline.from_pretrained(model, dtype=torch.float32)
    dp.set_progress_bar_config(disable=True)
    # The trimmed embeddings with an all-true boolean mask: diffusers' masking is then hard masking.
    kw = {}
    pe = torch.from_numpy(pos.embeds)[None]
    kw.update(prompt_embeds=pe, prompt_attention_mask=torch.ones(1, pe.shape[1], dtype=torch.bool))
    if neg is not None:
        ne = torch.from_numpy(neg.embeds)[None]
        kw.update(negative_prompt_embeds=ne,
                  negative_prompt_attention_mask=torch.ones(1, ne.shape[1], dtype=torch.bool))
    with torch.no_grad():
        out = dp(height=height, width=width, num_inference_steps=steps, guidance_scale=cfg, output_type="latent",
                 generator=torch.Generator("cpu").manual_seed(seed), **kw)
    return dp, out.images.numpy()


# ---- sampling arithmetic (no compile) -------------------------------------------------------

@pytest.mark.parametrize("steps", [1, 2, 9, 26, 50])
@pytest.mark.parametrize("seq", [16, 256, 1024, 4096, 6000])
def test_diffusers_schedule_is_bit_exact(steps, seq):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.chroma.pipeline_chroma import calculate_shift, retrieve_timesteps

    s = FlowMatchEulerDiscreteScheduler(**CHROMA1_HD_SCHEDULER)
    mu = calculate_shift(seq, 256, 4096, 0.5, 1.15)
    ts, _ = retrieve_timesteps(s, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    sig, t_model = sampling.schedule("diffusers", steps, seq, CHROMA1_HD_SCHEDULER)
    assert sig.dtype == np.float32 and np.array_equal(sig, s.sigmas.numpy())
    assert np.array_equal(t_model, (ts.to(torch.float32) / 1000).numpy())  # what the pipeline feeds the transformer
    # The Euler step: bit-exact with the scheduler's.
    x, v = np.random.default_rng(0).standard_normal((2, 1, 16, 64), dtype=np.float32)
    s.set_begin_index(0)
    want = s.step(torch.from_numpy(v), ts[0], torch.from_numpy(x), return_dict=False)[0].numpy()
    assert np.array_equal(sampling.euler_step(x, v, sig[0], sig[1]), want)


def test_diffusers_schedule_static_shift():
    from diffusers import FlowMatchEulerDiscreteScheduler

    cfg = dict(CHROMA1_HD_SCHEDULER, use_dynamic_shifting=False, shift=3.0)
    s = FlowMatchEulerDiscreteScheduler(**cfg)
    s.set_timesteps(sigmas=np.linspace(1.0, 1 / 26, 26))
    assert np.array_equal(sampling.schedule("diffusers", 26, 4096, cfg)[0], s.sigmas.numpy())


@pytest.mark.parametrize("steps", [1, 4, 26, 40])
def test_beta_schedule_against_an_independent_computation(steps):
    """SciPy's Beta inverse CDF and a float64 table (rounded to float32 per entry) against the
    pipeline's own bisection and float32 table: the same indices, the same float32 sigmas."""
    import scipy.stats

    qs = 1 - np.linspace(0, 1, steps, endpoint=False)
    idx = np.rint(scipy.stats.beta.ppf(qs, 0.45, 0.45) * 9999).astype(int)
    keep = [i for j, i in enumerate(idx) if j == 0 or i != idx[j - 1]]
    t = np.arange(1, 10001, dtype=np.float64) / 10000
    table = np.e / (np.e + (1 / t - 1))
    sig, t_model = sampling.schedule("beta", steps, 0)
    assert sig[-1] == 0 and len(sig) == len(keep) + 1 and sig.dtype == np.float32
    np.testing.assert_allclose(sig[:-1], table[keep], rtol=1e-6)
    assert np.array_equal(t_model, sig[:-1])
    assert np.all(np.diff(sig) < 0)


def test_beta_ppf_matches_scipy():
    import scipy.stats

    for a, b in ((0.45, 0.45), (0.6, 0.6), (2.0, 0.5)):
        for q in np.linspace(1e-4, 1 - 1e-4, 41):
            assert abs(sampling.beta_ppf(q, a, b) - scipy.stats.beta.ppf(q, a, b)) < 1e-12


def test_pack_and_noise_match_diffusers():
    from diffusers import ChromaPipeline

    x = np.random.default_rng(1).standard_normal((1, 16, 8, 12), dtype=np.float32)
    p = sampling.pack(x)
    assert np.array_equal(p, ChromaPipeline._pack_latents(torch.from_numpy(x), 1, 16, 8, 12).numpy())
    assert np.array_equal(sampling.unpack(p, 64, 96), x)
    want = ChromaPipeline._pack_latents(torch.randn((1, 16, 8, 12), generator=torch.Generator("cpu").manual_seed(7)),
                                        1, 16, 8, 12).numpy()
    assert np.array_equal(sampling.noise(7, 64, 96, torch_noise=True), want)
    a, b = sampling.noise(7, 64, 96), sampling.noise(7, 64, 96)
    assert np.array_equal(a, b) and a.shape == (1, 24, 64) and not np.array_equal(a, sampling.noise(8, 64, 96))


def test_cfg_matches_diffusers_formula():
    rng = np.random.default_rng(2)
    pos, neg = rng.standard_normal((2, 1, 8, 64), dtype=np.float32)
    want = (torch.from_numpy(neg) + 3.8 * (torch.from_numpy(pos) - torch.from_numpy(neg))).numpy()
    assert np.array_equal(sampling.cfg_combine(pos, neg, 3.8), want)


def test_tokenizer_matches_transformers(tiny):
    from transformers import AutoTokenizer

    from chroma.pipelines.text import Tokenizer

    ours = Tokenizer(os.path.join(tiny, "tokenizer"))
    ref = AutoTokenizer.from_pretrained(os.path.join(tiny, "tokenizer"))
    for p in (PROMPT, "", "Low quality, UGLY!! 42 foxes", OFFICIAL_NEGATIVE, "snow " * 600):
        r = ref(p, padding="max_length", max_length=512, truncation=True)
        n = sum(r["attention_mask"])
        assert ours(p) == r["input_ids"][:n], p[:40]
        x, m, keep = ours.encoder_input(ours(p), 512)
        assert x[0].tolist() == r["input_ids"] and m[0].tolist() == r["attention_mask"]
        assert keep == min(n + 1, 512)


# ---- files, metadata and errors -------------------------------------------------------------

def test_png_metadata_round_trip(tmp_path):
    from PIL import Image

    meta = {"prompt": "un renard roux \u2744 dans la neige", "seed": "12", "timings": json.dumps({"denoise": 1.5})}
    path = save_png(Image.new("RGB", (16, 16), (10, 20, 30)), str(tmp_path / "a" / "x.png"), meta)
    assert read_png_metadata(path) == meta


def _copy_model(tiny, tmp_path):
    import shutil

    dst = str(tmp_path / "m")
    shutil.copytree(tiny, dst)
    return dst


def test_bad_model_directories_name_the_problem(tiny, tmp_path):
    with pytest.raises(ModelDirError, match="not a directory"):
        ModelDir(str(tmp_path / "nope"))
    d = _copy_model(tiny, tmp_path)
    os.remove(os.path.join(d, "model_index.json"))
    with pytest.raises(ModelDirError, match=r"model_index\.json: missing"):
        ModelDir(d)
    d = _copy_model(tiny, tmp_path / "2")
    idx = json.load(open(os.path.join(d, "model_index.json")))
    del idx["transformer"]
    json.dump(idx, open(os.path.join(d, "model_index.json"), "w"))
    with pytest.raises(ModelDirError, match="field 'transformer' missing"):
        ModelDir(d)
    d = _copy_model(tiny, tmp_path / "3")
    os.remove(os.path.join(d, "vae", "diffusion_pytorch_model.safetensors"))
    with pytest.raises(ModelDirError, match=r"vae/diffusion_pytorch_model\.safetensors: missing"):
        ModelDir(d)
    d = _copy_model(tiny, tmp_path / "4")
    os.remove(os.path.join(d, "tokenizer", "tokenizer.json"))
    with pytest.raises(ModelDirError, match="missing the T5 tokenizer"):
        ModelDir(d)


def test_bad_settings_name_the_problem(tiny, cache):
    with pytest.raises(ValueError, match="unknown transformer variant 'q5'"):
        TextToImage(tiny, transformer="q5", cache_dir=cache)
    with pytest.raises(ValueError, match="unknown text encoder variant"):
        TextToImage(tiny, text_encoder="q4", cache_dir=cache)
    p = TextToImage(tiny, cache_dir=cache)
    with pytest.raises(ValueError, match="width 100 is not a multiple of 16"):
        p.run(PROMPT, width=100, height=64)
    with pytest.raises(ValueError, match="unknown schedule 'karras'"):
        p.run(PROMPT, width=64, height=64, schedule="karras")


def test_cli_errors_are_one_line(tiny, tmp_path):
    r = _cli("--model", tiny, "--prompt", PROMPT, "--width", "100", "--cache-dir", str(tmp_path))
    assert r.returncode != 0 and "chroma text-to-image: ValueError: width 100 is not a multiple of 16" in r.stderr
    r = _cli("--model", str(tmp_path), "--prompt", PROMPT)
    assert r.returncode != 0 and "not a directory" not in r.stderr and "model_index.json: missing" in r.stderr
    r = _cli("--model", tiny, "--prompt", PROMPT, "--transformer", "q5")
    assert r.returncode != 0 and "invalid choice: 'q5'" in r.stderr
    assert not os.listdir(tmp_path)


_MAIN = ("import sys; sys.argv = ['chroma'] + sys.argv[1:]\nfrom chroma.cli import main\ntry:\n    main()\n"
         "finally:\n    print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")


def _cli(*args):
    """`chroma text-to-image ARGS` in a fresh process; its stdout ends with TORCH or NO-TORCH
    (whether torch was imported)."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    return subprocess.run([sys.executable, "-c", _MAIN, "text-to-image", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root), timeout=600)


def test_dry_run_compiles_nothing(tiny, tmp_path):
    """--dry-run in a fresh cache: the report, and no artifact, no torch import."""
    cache = str(tmp_path / "cache")
    r = _cli("--model", tiny, "--prompt", PROMPT, "--dry-run", "--width", "512", "--height", "768", "--cache-dir", cache)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "512x768" in out and "nothing compiled, no weights read" in out
    for v in ("fp32", "bf16", "q8", "q6", "q4"):
        assert f"run with transformer {v}: peak" in out
    assert "arena unknown (not compiled yet: not counted)" in out
    assert "transformer auto -> q" in out and "margin" in out
    assert out.strip().endswith("NO-TORCH")
    assert not os.path.exists(cache) or not os.listdir(cache)


def test_planned_arenas_equal_the_compiled_ones(tmp_path):
    """ArtifactStore.plan (one block of each kind, random weights, lowered without code) against
    the compiled artifact's arena, on a model of several blocks of each kind: within 1% (at
    Chroma1-HD's full size they are equal to the byte); then --dry-run --plan reports them, and
    a later dry run reads them without torch."""
    import copy

    from chroma.pipelines.plan import _rules, _shapes
    from chroma.pipelines.random_model import TINY

    cfg = copy.deepcopy(TINY)
    cfg["transformer"].update(num_layers=2, num_single_layers=3)
    cfg["t5"].update(num_layers=3)
    d = write_random_model(str(tmp_path / "deep"), config=cfg, seed=1)
    cache = str(tmp_path / "cache")
    p = TextToImage(d, cache_dir=cache, transformer="q4", text_encoder="q8")
    for comp, variant in (("transformer", "q4"), ("text_encoder", "q8"), ("vae", "fp32")):
        shapes, rules = _shapes(comp, 96, 64, 16, 1), _rules(comp, variant)
        planned = p.store.plan(comp, rules, shapes)["arena"]
        p.store.get(comp, rules, shapes)
        compiled = max(e["arena"]["bytes"] for e in p.store.manifest(comp, rules, shapes)["entries"])
        assert abs(planned - compiled) <= 0.01 * compiled, (comp, planned, compiled)
    r = _cli("--model", d, "--dry-run", "--plan", "--width", "128", "--height", "64", "--cache-dir", cache)
    assert r.returncode == 0, r.stderr
    assert "arenas planned without weights" in r.stdout and "(planned)" in r.stdout, r.stdout
    assert "planned transformer fp32: arena" in r.stdout
    r = _cli("--model", d, "--dry-run", "--width", "128", "--height", "64", "--cache-dir", cache)
    assert r.returncode == 0, r.stderr
    assert "(planned)" in r.stdout and "not compiled yet" not in r.stdout and r.stdout.strip().endswith("NO-TORCH")
    r = _cli("--model", d, "--plan", "--prompt", PROMPT, "--cache-dir", cache)
    assert r.returncode != 0 and "--plan" in r.stderr


# ---- the pipeline against diffusers (default tier: one compile of each component) -------------

def test_pipeline_matches_diffusers(tiny, pipe):
    res = pipe.run(PROMPT, seed=3, width=W, height=H, steps=4, cfg=3.0, schedule="diffusers", torch_noise=True)
    dp, ref = _diffusers_latents(tiny, res.text["prompt"], res.text["negative"], seed=3, width=W, height=H, steps=4,
                                 cfg=3.0)
    assert np.abs(res.latents - ref).max() <= 1e-4 * np.abs(ref).max()
    # The text embeddings: diffusers' own T5 pass (512 padded tokens, masked), its first n + 1.
    with torch.no_grad():
        pe, mask = dp._get_t5_prompt_embeds(PROMPT, max_sequence_length=512)
    n = int(mask.sum())
    assert res.text["prompt"].tokens + 1 == n == len(res.text["prompt"])
    cos, rel = _rel(res.text["prompt"].embeds, pe[0, :n].numpy())
    assert cos >= 1 - 1e-6 and rel <= 1e-5
    assert res.text["negative"].prompt == OFFICIAL_NEGATIVE
    # The decoded image: diffusers' VAE and postprocessing, to one level of 255.
    with torch.no_grad():
        z = torch.from_numpy(sampling.unpack(res.latents, H, W))
        img = dp.vae.decode(z / dp.vae.config.scaling_factor + dp.vae.config.shift_factor, return_dict=False)[0]
    want = dp.image_processor.postprocess(img, output_type="np")[0]
    assert np.abs(np.asarray(res.image, np.float64) - np.round(want * 255)).max() <= 1
    assert res.image.size == (W, H) and res.latents.shape == (1, 16, 64)
    m = res.image.info
    assert m["seed"] == "3" and m["schedule"] == "diffusers" and m["transformer"] == "fp32"
    assert json.loads(m["sigmas"]) == [float(s) for s in res.sigmas]
    assert res.peak_memory["ru_maxrss"] > 0 and res.timings["denoise"] > 0


def test_cli_writes_a_png(tiny, pipe, cache, tmp_path):
    out = str(tmp_path / "img.png")
    lat = str(tmp_path / "lat.npy")
    emb = str(tmp_path / "emb.npz")
    r = _cli("--model", tiny, "--prompt", PROMPT, "--width", str(W), "--height", str(H), "--steps", "3", "--cfg", "2.5",
             "--transformer", "fp32", "--text-encoder", "fp32", "--cache-dir", cache, "--out", out, "--seed", "5",
             "--save-latents", lat, "--save-text-embeds", emb)
    assert r.returncode == 0, r.stderr
    assert "step 3/3" in r.stderr and f"wrote {out}" in r.stdout
    # Again, the components now from the cache: no torch at run time, no progress with --quiet.
    r2 = _cli("--model", tiny, "--prompt", PROMPT, "--width", str(W), "--height", str(H), "--steps", "3",
              "--transformer", "fp32", "--text-encoder", "fp32", "--cache-dir", cache, "--quiet",
              "--out", str(tmp_path / "again.png"))
    assert r2.returncode == 0 and r2.stdout.strip().endswith("NO-TORCH"), r2.stdout + r2.stderr
    assert r2.stdout.startswith("seed ") and "step" not in r2.stderr
    meta = read_png_metadata(out)
    for key in ("prompt", "negative", "seed", "width", "height", "steps", "cfg", "schedule", "cfg_mode", "transformer",
                "transformer_choice", "text_encoder", "timings", "peak_memory", "torch_noise", "sigmas"):
        assert key in meta, key
    assert meta["prompt"] == PROMPT and meta["seed"] == "5" and meta["schedule"] == "beta" and meta["cfg"] == "2.5"
    # The same run from the saved embeddings (no T5): the same latents.
    res = pipe.run(seed=5, width=W, height=H, steps=3, cfg=2.5, text_embeds=emb)
    assert np.array_equal(res.latents, np.load(lat))


def test_auto_choice_line():
    from chroma.pipelines.memory import GiB, choose_transformer

    needs = {"q6": {"total": int(8.81 * GiB), "detail": "q6 parts"},
             "q4": {"total": int(6.81 * GiB), "detail": "q4 parts"}}
    info = {"MemAvailable": int(40 * GiB)}
    v, line = choose_transformer(needs, int(40 * GiB), info, "1024x1024")
    assert v == "q6" and line.startswith("transformer auto -> q6 at 1024x1024: 40.00 GiB available now >= 9.81 GiB "
                                         "(q6's ~8.81 GiB + 1.00 GiB margin); q4 needs ~6.81 GiB; q6 needs ~8.81 GiB")
    v, line = choose_transformer(needs, int(7.85 * GiB), info, "256x256")
    assert v == "q4" and "7.85 GiB available now < 9.81 GiB" in line and "WARNING" not in line
    v, line = choose_transformer(needs, int(5 * GiB), info, "256x256")
    assert v == "q4" and "WARNING: even q4's ~6.81 GiB exceeds the 5.00 GiB available" in line
    assert "\n" not in line


# ---- full tier: each component, more configurations, the weight variants ---------------------

def _exact_t5(tiny, ids, pad_id):
    from transformers import T5EncoderModel

    t5 = T5EncoderModel.from_pretrained(os.path.join(tiny, "text_encoder"), dtype=torch.float32).eval()
    x = torch.tensor([ids + [pad_id]])
    m = torch.tensor([[1] * len(ids) + [0]])
    with torch.no_grad():
        return t5(input_ids=x, attention_mask=m)[0][0].numpy()


@pytest.mark.full  # compiles a second T5 bucket (the default tier's components are compared through the pipeline)
def test_components_match_references(tiny, pipe):
    """Each compiled component in float32 against diffusers / transformers; the bucketed and
    masked T5 and transformer against the exact-length computation."""
    from diffusers import AutoencoderKL, ChromaTransformer2DModel

    from chroma.pipelines.components import image_ids, text_ids
    from chroma.pipelines.memory import t5_rules

    tok = pipe.tokenizer
    ids = tok(PROMPT)
    want = _exact_t5(tiny, ids, tok.pad_id)
    for length in (64, 128):
        prog, _ = pipe.store.get("text_encoder", t5_rules("fp32"), {"length": length})
        x, m, keep = tok.encoder_input(ids, length)
        cos, rel = _rel(np.asarray(prog(x, m))[0, :keep], want)
        assert cos >= 1 - 1e-6 and rel <= 1e-5, (length, cos, rel)
    tr = ChromaTransformer2DModel.from_pretrained(os.path.join(tiny, "transformer"), dtype=torch.float32).eval()
    prog, _ = pipe.store.get("transformer", None, {"batch": 1, "h2": 4, "w2": 4, "length": 64})
    rng = np.random.default_rng(4)
    lat = rng.standard_normal((1, 16, 64), dtype=np.float32)
    n = len(ids) + 1
    text = rng.standard_normal((1, n, TINY["t5"]["d_model"]), dtype=np.float32)
    ctx = np.zeros((1, 64, text.shape[2]), np.float32)
    ctx[:, :n] = text
    bias = np.full((1, 64), -1e30, np.float32)
    bias[:, :n] = 0
    for t in (1.0, 0.37, 0.02):
        ts = np.array([t], np.float32)
        with torch.no_grad():
            ref = tr(hidden_states=torch.from_numpy(lat), timestep=torch.from_numpy(ts),
                     encoder_hidden_states=torch.from_numpy(text), txt_ids=text_ids(n), img_ids=image_ids(4, 4),
                     return_dict=False)[0].numpy()
        cos, rel = _rel(np.asarray(prog(lat, ts, ctx, bias)), ref)
        assert cos >= 1 - 1e-6 and rel <= 1e-5, (t, cos, rel)
    vae = AutoencoderKL.from_pretrained(os.path.join(tiny, "vae"), dtype=torch.float32).eval()
    prog, _ = pipe.store.get("vae", None, {"h": 8, "w": 8})
    z = rng.standard_normal((1, 16, 8, 8), dtype=np.float32)
    with torch.no_grad():
        ref = vae.decode(torch.from_numpy(z) / vae.config.scaling_factor + vae.config.shift_factor,
                         return_dict=False)[0].numpy()
    cos, rel = _rel(np.asarray(prog(z)), ref)
    assert cos >= 1 - 1e-6 and rel <= 1e-5, (cos, rel)


SMALL2 = {"t5": dict(TINY["t5"], num_layers=1), "vae": TINY["vae"],
          "transformer": dict(TINY["transformer"], num_layers=2, num_single_layers=1, approximator_layers=3)}


@pytest.mark.full  # a transformer and a VAE compile per configuration
@pytest.mark.parametrize("case", [
    dict(config=None, seed=11, width=48, height=80, cfg=3.8, cfg_mode="batched", steps=3, negative="blurry"),
    dict(config=None, seed=12, width=64, height=32, cfg=1.0, cfg_mode="separate", steps=3, negative=None),
    dict(config=SMALL2, seed=2, width=32, height=32, cfg=4.5, cfg_mode="separate", steps=5, negative=""),
], ids=["batched-48x80", "no-cfg-64x32", "config2-empty-negative"])
def test_pipeline_configurations_match_diffusers(case, tmp_path_factory, cache):
    tiny_model = write_random_model(str(tmp_path_factory.mktemp("m") / "c"), config=case["config"],
                                    seed=5 if case["config"] else 0)
    p = TextToImage(tiny_model, transformer="fp32", text_encoder="fp32", cache_dir=cache)
    res = p.run("a blue house at night", negative=case["negative"], seed=case["seed"], width=case["width"],
                height=case["height"], steps=case["steps"], cfg=case["cfg"], cfg_mode=case["cfg_mode"],
                schedule="diffusers", torch_noise=True)
    if case["cfg"] <= 1:
        assert res.text["negative"] is None and res.image.info["negative"] == ""
    _, ref = _diffusers_latents(tiny_model, res.text["prompt"], res.text["negative"], seed=case["seed"],
                                width=case["width"], height=case["height"], steps=case["steps"], cfg=case["cfg"])
    assert np.abs(res.latents - ref).max() <= 1e-4 * np.abs(ref).max()
    assert res.image.size == (case["width"], case["height"])


@pytest.mark.full  # compiles the transformer in q8 and q4
@pytest.mark.parametrize("variant,bound", [("q8", 0.03), ("q4", 0.08)])
def test_transformer_variants(variant, bound, pipe):
    """The rules keep x_embedder, context_embedder, the approximator and proj_out in bf16; the
    manifest's bytes are the estimate's; the guided velocity stays within `bound` (relative L2)
    of float32's at every step (measured on the tiny model: q8 0.8-0.9%, q4 1.8-2.0%, with the
    int8 activations the CPU's q4 kernels use)."""
    from chroma.pipelines import plan
    from chroma.pipelines.accuracy import velocity_errors
    from chroma.pipelines.memory import TRANSFORMER_KEEP_BF16, component_bytes, transformer_constants, transformer_rules

    errs = velocity_errors(pipe, variant, PROMPT, width=W, height=H, steps=4)
    shapes = {"batch": 1, "h2": 4, "w2": 4, "length": 64}
    m = pipe.store.manifest("transformer", transformer_rules(variant), shapes)
    w = m["options"]["weights"]
    for d in w["decisions"]:
        if any(fnmatch.fnmatchcase(d["name"], p) for p in TRANSFORMER_KEEP_BF16):
            assert d["format"] == "bf16", d
        elif d["shape"][0] * d["shape"][1] >= 4096:
            assert d["format"] == variant, d
    est = component_bytes(pipe.model.tensors("transformer"), "transformer.", transformer_rules(variant))
    assert est["products"] == w["product_weights_bytes"]
    st = plan.stage(pipe, "transformer", variant, W, H, 64)
    assert st["weights"] == m["weights"]["bytes"] and st["arena"] == m["arena"]["bytes"]
    est_total = component_bytes(pipe.model.tensors("transformer"), "transformer.", transformer_rules(variant),
                                transformer_constants(pipe.model.config("transformer"), 64 + 16))["total"]
    assert abs(est_total - m["weights"]["bytes"]) <= 0.02 * m["weights"]["bytes"], (est_total, m["weights"]["bytes"])
    assert max(errs) <= bound, errs
    print(f"{variant}: relative L2 of the guided velocity per step {['%.4f' % e for e in errs]}")


@pytest.mark.full  # compiles T5 in q8
def test_t5_q8_rules(tiny, cache):
    from chroma.pipelines.memory import component_bytes, t5_rules, text_encoder_constants

    p = TextToImage(tiny, text_encoder="q8", cache_dir=cache)
    ref = TextToImage(tiny, text_encoder="fp32", cache_dir=cache).encode(PROMPT)
    got = p.encode(PROMPT)
    err = float(np.linalg.norm(got.embeds - ref.embeds) / np.linalg.norm(ref.embeds))
    assert err <= 0.03, err
    m = p.store.manifest("text_encoder", t5_rules("q8"), {"length": 64})
    formats = {d["name"].split(".")[-2]: d["format"] for d in m["options"]["weights"]["decisions"]}
    assert {formats[k] for k in ("q", "k", "v", "o", "wi_0", "wi_1")} == {"q8"} and formats["wo"] == "bf16"
    emb = [d for d in m["options"]["weights"]["decisions"] if d.get("role") == "embedding"]
    assert emb and all(d["format"] == "bf16" for d in emb)
    est = component_bytes(p.model.tensors("text_encoder"), "t5.", t5_rules("q8"),
                          text_encoder_constants(p.model.config("text_encoder"), 64))
    assert est["products"] == m["options"]["weights"]["product_weights_bytes"]
    assert abs(est["total"] - m["weights"]["bytes"]) <= 0.02 * m["weights"]["bytes"], (est, m["weights"]["bytes"])


@pytest.mark.full  # runs the pipeline several times
def test_python_api_stages(pipe):
    """encode_many (one T5 session), denoise with the transformer kept loaded, then decode:
    the same latents and image as run()."""
    texts = pipe.encode_many([PROMPT, OFFICIAL_NEGATIVE, "a green tree"])
    assert "text_encoder" not in pipe._loaded
    kw = dict(width=W, height=H, steps=3, cfg=3.8, schedule_name="beta")
    lats = [pipe.denoise(texts[i], texts[1], seed=s, **kw) for i, s in ((0, 1), (2, 2))]
    assert "transformer" in pipe._loaded
    pipe.release_transformer()
    assert "transformer" not in pipe._loaded
    imgs = [pipe.decode(lat, H, W) for lat in lats]
    res = pipe.run(PROMPT, seed=1, width=W, height=H, steps=3, cfg=3.8)
    assert np.array_equal(res.latents, lats[0]) and np.array_equal(np.asarray(res.image), np.asarray(imgs[0]))
    assert not pipe._loaded  # run() releases every component
    assert res.image.info["transformer_choice"].startswith("transformer fp32")
    # denoise(text, seed=s) as the SPEC writes it: the official negative prompt, encoded once.
    assert np.array_equal(pipe.denoise(texts[0], seed=1, **kw), lats[0])
    assert pipe.official_negative() is pipe.official_negative()


@pytest.mark.full  # compiles the three components for WebGPU and runs them on a software adapter
def test_webgpu_target_matches_cpu(tiny, cache, tmp_path):
    """The pipeline on another target: WebGPU (lavapipe through the `wgpu` package) gives the
    CPU's latents to float32 rounding (the GPU's exp and sums differ in the last bits)."""
    pytest.importorskip("wgpu")
    os.environ.setdefault("VK_ICD_FILENAMES", "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
    kw = dict(seed=1, width=32, height=32, steps=2, cfg=3.0)
    gpu = TextToImage(tiny, target="webgpu", transformer="fp32", text_encoder="fp32", cache_dir=str(tmp_path)).run(
        PROMPT, **kw)
    cpu = TextToImage(tiny, transformer="fp32", text_encoder="fp32", cache_dir=cache).run(PROMPT, **kw)
    assert np.abs(gpu.latents - cpu.latents).max() <= 1e-4 * np.abs(cpu.latents).max()
    assert gpu.image.info["target"] == "webgpu"


def test_dry_run_at_chroma1_hd_sizes(tmp_path):
    """The dry run on a directory with Chroma1-HD's configs and safetensors headers (sparse
    files, no weights): the bytes per variant at the real scale, and the auto line."""
    from chroma.pipelines.memory import GiB
    from chroma.pipelines.random_model import write_shapes_only_model

    d = write_shapes_only_model(str(tmp_path / "hd"))
    p = TextToImage(d, cache_dir=str(tmp_path / "cache"))
    ckpt = p.model.file_bytes("transformer")
    assert 17.7e9 < ckpt < 17.9e9  # 8.9B parameters in bfloat16
    from chroma.pipelines import plan

    w = {v: plan.stage(p, "transformer", v, 1024, 1024, 64)["weights"] for v in ("fp32", "bf16", "q8", "q6", "q4")}
    assert abs(w["bf16"] - ckpt) <= 0.005 * ckpt and abs(w["fp32"] - 2 * ckpt) <= 0.005 * ckpt
    # q8/q6/q4: 8.5/6.5/4.5 bits a weight (a float16 scale and bias per 64), the bf16 rules' layers aside.
    for v, bits in (("q8", 8.5), ("q6", 6.5), ("q4", 4.5)):
        assert bits / 16 * ckpt < w[v] < (bits / 16 + 0.03) * ckpt, (v, w[v] / GiB)
    lines = p.dry_run(PROMPT, width=1024, height=1024)
    assert lines[-1].startswith("transformer auto -> q") and "at 1024x1024" in lines[-1]
    assert any(line.startswith("  q4    weights 5.") for line in lines), lines


def test_sharded_weights(tiny, tmp_path):
    """A component in shards with their index (how Chroma1-HD's transformer and T5 are stored):
    the same tensors; a shard the index names but the directory lacks is named."""
    from safetensors.torch import load_file, save_file

    d = _copy_model(tiny, tmp_path)
    comp = os.path.join(d, "transformer")
    single = os.path.join(comp, "diffusion_pytorch_model.safetensors")
    state = load_file(single)
    names = sorted(state)
    halves = {"diffusion_pytorch_model-00001-of-00002.safetensors": names[: len(names) // 2],
              "diffusion_pytorch_model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for f, keys in halves.items():
        save_file({k: state[k] for k in keys}, os.path.join(comp, f))
    with open(os.path.join(comp, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {k: f_ for f_, ks in halves.items() for k in ks}}, f)
    want = ModelDir(tiny).tensors("transformer")
    os.remove(single)
    m = ModelDir(d)
    assert m.tensors("transformer") == want and len(m.weight_files("transformer")) == 2
    os.remove(os.path.join(comp, "diffusion_pytorch_model-00002-of-00002.safetensors"))
    with pytest.raises(ModelDirError, match="00002-of-00002.safetensors: missing"):
        ModelDir(d)
