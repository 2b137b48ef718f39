"""The real components at their published sizes: parameter counts, built on the meta
device (shapes only, no memory), so a `full` case is known to gate the published models."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from perfguard.workloads.components import (
    component_info,
    glm_components,
    qwen_components,
    seeded_init_,
)
from perfguard.workloads.presets import get_preset

META = torch.device("meta")


def _counts(parts: dict[str, object]) -> dict[str, int]:
    return {role: component_info(obj)["parameters"] for role, obj in parts.items()}


def test_qwen_image_full_components_have_the_published_sizes() -> None:
    dit = get_preset("qwen_image", "full")
    parts = qwen_components(
        "full",
        text_dim=dit["joint_attention_dim"],
        latent_channels=dit["in_channels"] // 4,
        device=META,
        dtype=torch.bfloat16,
        seed=0,
    )
    # Qwen2.5-VL-7B-Instruct: 8,292,166,656 parameters (its model card's 8.29B); the
    # Qwen-Image VAE: 126.9M.
    assert _counts(parts) == {"tokenizer": 0, "text_encoder": 8_292_166_656, "vae": 126_892_531}
    text = parts["text_encoder"].config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (3584, 28, 152064)


def test_glm_image_full_components_have_the_published_sizes() -> None:
    dit = get_preset("glm_image", "full")
    parts = glm_components(
        "full",
        text_dim=dit["text_embed_dim"],
        latent_channels=dit["in_channels"],
        codebook_size=dit["prior_vq_quantizer_codebook_size"],
        device=META,
        dtype=torch.bfloat16,
        seed=0,
    )
    assert _counts(parts) == {
        "processor": 0,
        # GLM-Image's AR model: the 9B language model (8,847,155,200 + a 16512-way head)
        # plus its vision tower and VQ tokenizer.
        "vision_language_encoder": 10_114_245_632,
        "tokenizer": 0,
        "text_encoder": 218_222_720,  # ByT5-small's encoder
        "vae": 83_819_683,
    }
    ar = parts["vision_language_encoder"]
    language = sum(p.numel() for p in ar.model.language_model.parameters())
    assert language == 8_847_155_200
    assert ar.lm_head.weight.shape == (16512, 4096)


def test_seeded_init_is_deterministic_and_scaled_by_fan_in() -> None:
    def make() -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Conv2d(64, 32, 3), torch.nn.GroupNorm(4, 32), torch.nn.Linear(32, 8)
        )

    a, b, c = seeded_init_(make(), 0), seeded_init_(make(), 0), seeded_init_(make(), 1)
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a[0].weight, c[0].weight)
    assert a[0].weight.std().item() == pytest.approx((64 * 9) ** -0.5, rel=0.05)
    assert torch.equal(a[1].weight, torch.ones(32)) and torch.equal(a[0].bias, torch.zeros(32))
