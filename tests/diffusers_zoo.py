"""Tiny diffusers pipelines built as diffusers' own tests build them, offline.

Each builder mirrors the `get_dummy_components` of the pipeline's test in diffusers
(`tests/pipelines/<name>/test_*.py`): random weights, a few channels, one or two layers.
Where diffusers' tests download a tiny tokenizer from the Hub, the tokenizer here is
built in memory from a small vocabulary of the same class, so nothing is downloaded.
`depth` multiplies the denoiser's layers (the "deeper denoiser" a gate must catch); the
other components keep their weights (the same seed), so only the denoiser's work moves.
"""

from __future__ import annotations

from typing import Any

import torch

WORDS = ["a", "red", "fox", "in", "the", "snow", "blurry", "photo", "of", "cat"]
"""The prompts' words: whole-word pieces, so prompts tokenize the same on every machine."""


def t5_tokenizer() -> Any:
    """A SentencePiece-style (Unigram) `T5Tokenizer` over `WORDS` and the letters."""
    from transformers import T5Tokenizer

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [("\u2581" + w, -1.0) for w in WORDS]
    vocab += [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz\u2581"]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=512)


def clip_tokenizer() -> Any:
    """A byte-level `CLIPTokenizer` (every byte, with and without the end-of-word mark)."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def gemma_tokenizer() -> Any:
    """A `GemmaTokenizer` (BPE, no merges) over `WORDS`, the letters and its markers."""
    from transformers import GemmaTokenizer

    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581", *("\u2581" + w for w in WORDS)]
    pieces += list("abcdefghijklmnopqrstuvwxyz")
    return GemmaTokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=[])


def t5_encoder(vocab: int, umt5: bool = False) -> Any:
    """A two-layer T5 encoder (UMT5's, as Wan's pipeline declares, with `umt5`)."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config = (UMT5Config if umt5 else T5Config)(
        vocab_size=vocab,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        is_encoder_decoder=False,
    )
    return (UMT5EncoderModel if umt5 else T5EncoderModel)(config).eval()


def stable_diffusion(depth: int = 1) -> Any:
    """`StableDiffusionPipeline` (UNet, CLIP text encoder, `AutoencoderKL`, DDIM)."""
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    tokenizer = clip_tokenizer()
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            hidden_size=32,
            intermediate_size=64,
            layer_norm_eps=1e-05,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(tokenizer),
        )
    ).eval()
    vae = AutoencoderKL(
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        norm_num_groups=2,
    )
    torch.manual_seed(1)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=depth,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=2,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def pixart_sigma(depth: int = 1) -> Any:
    """`PixArtSigmaPipeline`: a `__call__` with the legacy `callback` only."""
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        PixArtSigmaPipeline,
        PixArtTransformer2DModel,
    )

    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    text_encoder = t5_encoder(len(tokenizer))
    vae = AutoencoderKL(
        block_out_channels=[8],
        latent_channels=4,
        norm_num_groups=4,
    )
    torch.manual_seed(1)
    transformer = PixArtTransformer2DModel(
        sample_size=8,
        num_layers=2 * depth,
        patch_size=2,
        attention_head_dim=8,
        num_attention_heads=3,
        caption_channels=32,
        in_channels=4,
        cross_attention_dim=24,
        out_channels=8,
        attention_bias=True,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_single",
        norm_elementwise_affine=False,
        norm_eps=1e-6,
    )
    return PixArtSigmaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=DDIMScheduler(),
    )


def sana(depth: int = 1) -> Any:
    """`SanaPipeline` (linear-attention DiT, Gemma-2 text encoder, `AutoencoderDC`)."""
    from diffusers import (
        AutoencoderDC,
        FlowMatchEulerDiscreteScheduler,
        SanaPipeline,
        SanaTransformer2DModel,
    )
    from transformers import Gemma2Config, Gemma2Model

    torch.manual_seed(0)
    tokenizer = gemma_tokenizer()
    text_encoder = Gemma2Model(
        Gemma2Config(
            head_dim=16,
            hidden_size=8,
            intermediate_size=64,
            max_position_embeddings=8192,
            num_attention_heads=2,
            num_hidden_layers=1,
            num_key_value_heads=2,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            attn_implementation="eager",
        )
    ).eval()
    vae = AutoencoderDC(
        in_channels=3,
        latent_channels=4,
        attention_head_dim=2,
        encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8),
        encoder_qkv_multiscales=((), (5,)),
        decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1),
        decoder_layers_per_block=[1, 1],
        downsample_block_type="conv",
        upsample_block_type="interpolate",
        decoder_norm_types="rms_norm",
        decoder_act_fns="silu",
        scaling_factor=0.41407,
    )
    torch.manual_seed(1)
    transformer = SanaTransformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=depth,
        num_attention_heads=2,
        attention_head_dim=4,
        num_cross_attention_heads=2,
        cross_attention_head_dim=4,
        cross_attention_dim=8,
        caption_channels=8,
        sample_size=32,
    )
    return SanaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )


def wan(depth: int = 1) -> Any:
    """`WanPipeline`: text to video (3D VAE, `WanTransformer3DModel`, UMT5-style encoder)."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    text_encoder = t5_encoder(len(tokenizer), umt5=True)
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    torch.manual_seed(1)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2 * depth,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )


ZOO = {
    "stable_diffusion": stable_diffusion,
    "pixart_sigma": pixart_sigma,
    "sana": sana,
    "wan": wan,
}
"""name -> builder(depth)."""
