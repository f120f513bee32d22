"""torchvision classification models with seeded random weights: compiled with Chroma, run,
compared with eager PyTorch (batch 2, 224 x 224).

Tolerance: max abs error <= 1e-4 x the largest eager logit (chroma.models.vision.RTOL_SCALE:
summation order and folded batch norms differ from oneDNN's; the error through tens of
layers is about 1e-6 .. 1e-5 of the output's scale). The logits must also not be all
(near) zero, so the comparison means something.

The whole list: `.venv/bin/python tools/vision_models.py` (writes docs/models.md).
"""

import pytest

from chroma.models import vision

MODELS = ["resnet18", "mobilenet_v3_small", "squeezenet1_0", "shufflenet_v2_x1_0", "efficientnet_b0"]


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_eager(name, tmp_path):
    r = vision.check(name, batch=2, out=str(tmp_path / name), threads=1)
    assert "error" not in r, r["error"]
    assert r["max_abs_output"] > 1e-3, r
    assert r["passed"], r


def test_zero_initialized_heads_get_random_weights():
    # torchvision zero-initializes the ViT classification head: every logit would equal its
    # (zero) bias and any compiled program would "match"; build() gives such layers weights
    import torch

    model = vision.build("vit_b_32")
    head = model.heads.head
    assert head.weight.abs().max() > 0 and head.bias.abs().max() > 0
    with torch.inference_mode():
        y = model(vision.example_input("vit_b_32"))
    assert float(y.max() - y.min()) > 1e-2
