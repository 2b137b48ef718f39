"""perfguard's Qwen-Image / GLM-Image transformers equal diffusers 0.42 with shared weights.

Tiny configs, batch 2, float32, max abs diff <= 1e-5; state dicts load strictly both ways.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from perfguard.workloads.glm_image import GlmImageTransformer2DModel  # noqa: E402
from perfguard.workloads.presets import get_preset, init_weights_  # noqa: E402
from perfguard.workloads.qwen_image import QwenImageTransformer2DModel  # noqa: E402
from tests.helpers import (  # noqa: E402
    GLM_BATCH,
    GLM_GLYPH_LEN,
    GLM_LAT_H,
    GLM_LAT_W,
)
from tests.helpers import glm_dit_inputs as _glm_inputs  # noqa: E402

ATOL = 1e-5
# Larger than build_model's 0.02 so activations are O(1) and a mismatch cannot hide.
INIT_STD = 0.1


def _pair(ours_cls, theirs_cls, config: dict, seed: int = 0):
    ours = init_weights_(ours_cls(**config), seed, std=INIT_STD).eval()
    theirs = theirs_cls(**config).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    return ours, theirs


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


# ----------------------------------------------------------------------------------------
# Qwen-Image
# ----------------------------------------------------------------------------------------

QWEN_TINY = get_preset("qwen_image", "tiny")
B, T, H, W = 2, 7, 4, 6  # text length 7, 4x6 patch grid -> 24 image tokens


def _qwen_inputs(config: dict, seed: int = 1, n_images: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(B, n_images * H * W, config["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(B, T, config["joint_attention_dim"], generator=g),
        timestep=torch.tensor([0.25, 0.8]),
        img_shapes=[[(1, H, W)] * n_images] * B,
    )


def _padded_mask() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.long)  # the pipeline's mask dtype
    mask[1, 4:] = 0  # row 1 has 4 valid text tokens, 3 padded
    return mask


def _assert_loads_strictly(ours_cls: type, theirs_cls: type, config: dict) -> None:
    """diffusers' state dict loads into ours strictly, with the same names in its order."""
    theirs = theirs_cls(**config)
    ours = ours_cls(**config)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_qwen_state_dict_loads_strictly_from_diffusers() -> None:
    _assert_loads_strictly(
        QwenImageTransformer2DModel, diffusers.QwenImageTransformer2DModel, QWEN_TINY
    )


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padded_mask"])
@pytest.mark.parametrize("host_meta", [True, False], ids=["host_meta", "mask_meta"])
def test_qwen_matches_diffusers(masked: bool, host_meta: bool) -> None:
    ours, theirs = _pair(
        QwenImageTransformer2DModel, diffusers.QwenImageTransformer2DModel, QWEN_TINY
    )
    ours.qwen_varlen_host_meta = host_meta
    inputs = _qwen_inputs(QWEN_TINY)
    mask = _padded_mask() if masked else None
    with torch.no_grad():
        expected = theirs(**inputs, encoder_hidden_states_mask=mask).sample
        got = ours(**inputs, encoder_hidden_states_mask=mask).sample
        # sglang style: the same mask also described as host-side lengths.
        got_lens = ours(
            **inputs, encoder_hidden_states_mask=mask, txt_seq_lens=[7, 4] if masked else [7, 7]
        ).sample
    assert torch.isfinite(expected).all() and expected.abs().max() > 0.1
    assert _max_diff(got, expected) <= ATOL
    assert _max_diff(got_lens, expected) <= ATOL


def test_qwen_cfg_pair_with_cache_matches_diffusers() -> None:
    """cond + uncond with one shared timestep tensor (cache hit on the uncond pass)."""
    ours, theirs = _pair(
        QwenImageTransformer2DModel, diffusers.QwenImageTransformer2DModel, QWEN_TINY
    )
    inputs = _qwen_inputs(QWEN_TINY)
    neg = torch.randn(B, T, QWEN_TINY["joint_attention_dim"], generator=torch.Generator())
    with torch.inference_mode():
        exp_cond = theirs(**inputs).sample
        exp_uncond = theirs(**{**inputs, "encoder_hidden_states": neg}).sample
        got_cond = ours(**inputs).sample
        got_uncond = ours(**{**inputs, "encoder_hidden_states": neg}).sample
    assert _max_diff(got_cond, exp_cond) <= ATOL
    assert _max_diff(got_uncond, exp_uncond) <= ATOL


@pytest.mark.parametrize(
    "extra",
    [{"zero_cond_t": True}, {"use_additional_t_cond": True}],
    ids=["zero_cond_t", "additional_t_cond"],
)
def test_qwen_variants_match_diffusers(extra: dict) -> None:
    config = {**QWEN_TINY, **extra}
    ours, theirs = _pair(QwenImageTransformer2DModel, diffusers.QwenImageTransformer2DModel, config)
    n_images = 2 if extra.get("zero_cond_t") else 1  # edit-style: target + reference image
    inputs = _qwen_inputs(config, n_images=n_images)
    if extra.get("use_additional_t_cond"):
        inputs["additional_t_cond"] = torch.tensor([0, 1])
    with torch.no_grad():
        expected = theirs(**inputs, encoder_hidden_states_mask=_padded_mask()).sample
        got = ours(**inputs, encoder_hidden_states_mask=_padded_mask()).sample
    assert _max_diff(got, expected) <= ATOL


def test_qwen_block_valid_rows_match_diffusers() -> None:
    """Block level: image rows and *valid* text rows equal diffusers. Padded text rows are 0
    from the varlen attention where diffusers lets them attend to the valid keys; they are
    masked as keys everywhere, which is why the model output above is equal."""
    ours, theirs = _pair(
        QwenImageTransformer2DModel, diffusers.QwenImageTransformer2DModel, QWEN_TINY
    )
    g = torch.Generator().manual_seed(5)
    dim = ours.inner_dim
    img = torch.randn(B, H * W, dim, generator=g)
    txt = torch.randn(B, T, dim, generator=g)
    temb = torch.randn(B, dim, generator=g)
    mask = _padded_mask().bool()
    rope = theirs.pos_embed([[(1, H, W)]] * B, max_txt_seq_len=T, device=torch.device("cpu"))
    meta = ours._joint_varlen_meta(mask, None, B, T, H * W, torch.device("cpu"))
    with torch.no_grad():
        exp_txt, exp_img = theirs.transformer_blocks[0](
            hidden_states=img,
            encoder_hidden_states=txt,
            encoder_hidden_states_mask=mask,
            temb=temb,
            image_rotary_emb=rope,
        )
        got_txt, got_img = ours.transformer_blocks[0](img, txt, temb, rope, meta)
    assert _max_diff(got_img, exp_img) <= ATOL
    assert _max_diff(got_txt[mask], exp_txt[mask]) <= ATOL


# ----------------------------------------------------------------------------------------
# GLM-Image
# ----------------------------------------------------------------------------------------

GLM_TINY = get_preset("glm_image", "tiny")
LAT_H, LAT_W, GLYPH_LEN = GLM_LAT_H, GLM_LAT_W, GLM_GLYPH_LEN
assert GLM_BATCH == B


def test_glm_state_dict_loads_strictly_from_diffusers() -> None:
    _assert_loads_strictly(
        GlmImageTransformer2DModel, diffusers.GlmImageTransformer2DModel, GLM_TINY
    )


@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "masked_fill"])
def test_glm_matches_diffusers(inplace: bool) -> None:
    ours, theirs = _pair(GlmImageTransformer2DModel, diffusers.GlmImageTransformer2DModel, GLM_TINY)
    ours.glm_prior_drop_inplace = inplace
    inputs = _glm_inputs(GLM_TINY)
    with torch.no_grad():
        expected = theirs(**inputs, return_dict=False)[0]
        got = ours(**inputs, return_dict=False)[0]
    assert got.shape == (B, GLM_TINY["out_channels"], LAT_H, LAT_W)
    assert torch.isfinite(expected).all() and expected.abs().max() > 0.1
    assert _max_diff(got, expected) <= ATOL


def test_glm_pipeline_style_separate_passes_match_diffusers() -> None:
    """Batch-2 cond pass (all False) and uncond pass (all True) exactly as the pipeline does,
    including the inactive KV-cache object it always passes."""
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    ours, theirs = _pair(GlmImageTransformer2DModel, diffusers.GlmImageTransformer2DModel, GLM_TINY)
    inputs = _glm_inputs(GLM_TINY)
    kv = GlmImageKVCache(num_layers=GLM_TINY["num_layers"])
    for value in (False, True):
        drop = torch.full_like(inputs["prior_token_id"], value, dtype=torch.bool)
        kw = {**inputs, "prior_token_drop": drop, "kv_caches": kv, "return_dict": False}
        with torch.no_grad():
            assert _max_diff(ours(**kw)[0], theirs(**kw)[0]) <= ATOL


# ----------------------------------------------------------------------------------------
# Half precision: same ops in the same order and dtypes -> bit-identical on CPU
# ----------------------------------------------------------------------------------------


def test_qwen_bfloat16_bit_identical_to_diffusers() -> None:
    """Catches dtype-cast drift (e.g. where the sinusoidal timestep table is rounded) that
    float32 comparisons cannot see."""
    ours, theirs = _pair(
        QwenImageTransformer2DModel, diffusers.QwenImageTransformer2DModel, QWEN_TINY
    )
    ours, theirs = ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
    inputs = _qwen_inputs(QWEN_TINY)
    inputs = {k: v.to(torch.bfloat16) if torch.is_tensor(v) else v for k, v in inputs.items()}
    with torch.no_grad():
        assert torch.equal(ours(**inputs).sample, theirs(**inputs).sample)


def test_glm_bfloat16_bit_identical_to_diffusers() -> None:
    ours, theirs = _pair(GlmImageTransformer2DModel, diffusers.GlmImageTransformer2DModel, GLM_TINY)
    ours, theirs = ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
    inputs = _glm_inputs(GLM_TINY)
    for name in ("hidden_states", "encoder_hidden_states", "target_size", "crop_coords"):
        inputs[name] = inputs[name].to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(ours(**inputs).sample, theirs(**inputs).sample)


def test_glm_text_attention_mask_parity() -> None:
    """The pipeline never passes one, but a text mask is handled exactly as diffusers does."""
    ours, theirs = _pair(GlmImageTransformer2DModel, diffusers.GlmImageTransformer2DModel, GLM_TINY)
    inputs = _glm_inputs(GLM_TINY)
    mask = torch.ones(B, GLYPH_LEN)
    mask[0, :2] = 0  # left padding, as the glyph embeddings are padded
    with torch.no_grad():
        expected = theirs(**inputs, attention_mask=mask).sample
        got = ours(**inputs, attention_mask=mask).sample
    assert _max_diff(got, expected) <= ATOL
