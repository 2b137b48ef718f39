"""The real non-DiT components of the Qwen-Image and GLM-Image pipelines, per preset.

Every component is the published architecture from diffusers 0.42 / transformers 5, built
from a config with seeded random weights; nothing is downloaded:

| workload   | role                      | class                                                  |
|------------|---------------------------|--------------------------------------------------------|
| qwen_image | `text_encoder`            | `transformers.Qwen2_5_VLForConditionalGeneration`      |
| qwen_image | `tokenizer`               | `transformers.Qwen2Tokenizer` (in-memory byte-level BPE)|
| qwen_image | `vae`                     | `diffusers.AutoencoderKLQwenImage`                     |
| glm_image  | `vision_language_encoder` | `transformers.GlmImageForConditionalGeneration` (AR)   |
| glm_image  | `processor`               | `transformers.GlmImageProcessor` over an in-memory BPE |
| glm_image  | `text_encoder`            | `transformers.T5EncoderModel` (ByT5 glyph encoder)     |
| glm_image  | `tokenizer`               | `transformers.ByT5Tokenizer` (needs no files)          |
| glm_image  | `vae`                     | `diffusers.AutoencoderKL`                              |

Sizes per preset: `tiny` and `small` shrink widths and depths so a CPU case runs in
seconds; `full` is the published size of each component, with the source of its config
named beside it. A `full` text encoder or AR model has the published width, depth and
vocabulary; only the ids of special tokens are placed where the in-memory tokenizers put
them (they decide what the model reads, not what it costs).

Tokenizers are trained in memory (`tokenizers.BpeTrainer`) over the prompt template and a
fixed word list, so each word is one token: a case's `prompt_lengths` then says exactly how
many text tokens the DiT attends to, as the real tokenizer would for a real prompt of that
length.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = [
    "COMPONENT_CONFIGS",
    "QWEN_PROMPT_TEMPLATE",
    "QWEN_PROMPT_TEMPLATE_START_IDX",
    "SCHEDULER_CONFIGS",
    "WORDS",
    "build_component",
    "component_info",
    "glm_components",
    "glm_processor",
    "qwen_components",
    "qwen_tokenizer",
    "seeded_init_",
]

# diffusers' QwenImagePipeline.prompt_template_encode and its start index: the 34 template
# tokens before the user's prompt are dropped from the encoder's last hidden state.
QWEN_PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
QWEN_PROMPT_TEMPLATE_START_IDX = 34
# Tokens the template adds after the prompt (`<|im_end|>`, `\n`, `<|im_start|>`,
# `assistant`, `\n`): they stay in the embeddings the DiT sees.
QWEN_PROMPT_SUFFIX_TOKENS = 5

# Prompt words: lowercase, one token each in both in-memory tokenizers.
_WORD_TEXT = (
    "red fox snow forest river mountain city street night light cat dog bird tree flower "
    "sky cloud sun moon star house window door road car boat sea beach sand stone glass "
    "paper book table chair lamp garden field grass rain wind fire smoke bridge tower "
    "castle market crowd child woman man portrait painting photo blue green golden silver "
    "old young quiet bright dark soft sharp"
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())

# Scheduler configs as the checkpoints' `scheduler/scheduler_config.json`.
SCHEDULER_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen-Image scheduler/scheduler_config.json (huggingface.co/Qwen/Qwen-Image); the
    # same values are mirrored in mflux's Qwen FlowMatchEulerDiscreteScheduler and in
    # ModelTC/Qwen-Image-Lightning's generate_with_diffusers.py (which edits the shifts).
    "qwen_image": {
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "invert_sigmas": False,
        "max_image_seq_len": 8192,
        "max_shift": 0.9,
        "num_train_timesteps": 1000,
        "shift": 1.0,
        "shift_terminal": 0.02,
        "stochastic_sampling": False,
        "time_shift_type": "exponential",
        "use_beta_sigmas": False,
        "use_dynamic_shifting": True,
        "use_exponential_sigmas": False,
        "use_karras_sigmas": False,
    },
    # GLM-Image: GlmImagePipeline reads base_image_seq_len / base_shift / max_shift with the
    # defaults 256 / 0.25 / 0.75 and passes its own integer timesteps and sigmas; the
    # exponential dynamic shift is FlowMatchEulerDiscreteScheduler's default.
    "glm_image": {
        "base_image_seq_len": 256,
        "base_shift": 0.25,
        "max_shift": 0.75,
        "num_train_timesteps": 1000,
        "shift": 1.0,
        "time_shift_type": "exponential",
        "use_dynamic_shifting": True,
    },
}


def _reduced_qwen(
    hidden: int, heads: int, mrope: list[int], vision: int, vae_dim: int, z_dim: int
) -> dict[str, dict[str, Any]]:
    """A reduced Qwen-Image's component configs: a 2-layer text model with MLPs twice the
    width and half the heads for keys and values, the tokenizer's vocabulary, one vision
    block of 2 heads, and a VAE of one res block per level. The VAE's default latents_mean
    / latents_std are the checkpoint's 16 values: another z_dim gets zeros and ones."""
    vae: dict[str, Any] = dict(
        base_dim=vae_dim,
        z_dim=z_dim,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    if z_dim != 16:
        vae.update(latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim)
    return {
        "text": dict(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=heads,
            num_key_value_heads=heads // 2,
            mrope_section=mrope,
            vocab_size=None,  # the tokenizer's size
        ),
        "vision": dict(
            depth=1, hidden_size=vision, intermediate_size=2 * vision, num_heads=2, fullatt=(0,)
        ),
        "vae": vae,
    }


def _reduced_glm_text(
    hidden: int, layers: int, heads: int, positions: int, mrope: list[int]
) -> dict[str, Any]:
    """A reduced GLM-Image AR text model: MLPs twice the width, half the heads for keys
    and values."""
    return dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=positions,
        rope_parameters={"mrope_section": mrope},
    )


def _reduced_glm_vision(width: int, image: int, patch: int) -> dict[str, Any]:
    """A reduced GLM-Image vision tower: one block of 2 heads, MLP twice the width."""
    return dict(
        depth=1,
        hidden_size=width,
        num_heads=2,
        image_size=image,
        patch_size=patch,
        intermediate_size=2 * width,
    )


def _reduced_glm_ar(
    text: dict[str, Any], vision: dict[str, Any], vocab_extra: int
) -> dict[str, Any]:
    """A reduced GLM-Image AR model's config: its text model, its vision tower, and a VQ
    as wide as the vision tower."""
    width = vision["hidden_size"]
    return dict(
        text=text,
        vision=vision,
        vq=dict(embed_dim=width, latent_channels=width),
        vision_vocab_extra=vocab_extra,
    )


# Component configs per workload and preset. `full` sources:
# * Qwen2.5-VL-7B: Qwen/Qwen2.5-VL-7B-Instruct config.json (the text encoder of
#   Qwen/Qwen-Image text_encoder/config.json): text 3584 wide, 28 layers, 28 heads, 4 KV
#   heads, MLP 18944, vocab 152064, mrope [16, 24, 24]; vision tower 32 blocks, 1280 wide.
# * Qwen-Image VAE: diffusers' AutoencoderKLQwenImage defaults, which are the published
#   Qwen/Qwen-Image vae/config.json (base_dim 96, z_dim 16, dim_mult [1, 2, 4, 4], two res
#   blocks, latents_mean / latents_std of the checkpoint).
# * GLM-Image AR model: transformers' GlmImageConfig defaults, documented as the
#   zai-org/GLM-Image checkpoint (text 4096 wide, 40 layers, 32 heads, 2 KV heads, vocab
#   168064, vision vocab 16512; vision tower 40 blocks; VQ codebook 16384).
# * ByT5 glyph encoder: google/byt5-small's encoder (d_model 1472 = the DiT's
#   text_embed_dim, d_ff 3584, 12 layers, 6 heads of 64, vocab 384, gated-gelu).
# * GLM-Image VAE: AutoencoderKL, 16 latent channels, block_out_channels
#   [128, 256, 512, 512], two layers per block (as fastvideo's GlmImageVAEArchConfig
#   mirrors zai-org/GLM-Image vae/config.json). The checkpoint's latents_mean/latents_std
#   values are not available offline: zeros and ones stand in; they change the decoded
#   values, not the work.
COMPONENT_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen_image": {
        # _reduced_qwen(text width, heads, mrope, vision width, VAE base_dim, z_dim)
        "tiny": _reduced_qwen(32, 2, [2, 3, 3], 16, 8, 4),
        "small": _reduced_qwen(256, 4, [8, 12, 12], 32, 16, 16),
        "full": {
            "text": dict(
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
                mrope_section=[16, 24, 24],
                vocab_size=152064,
                rms_norm_eps=1e-6,
                max_position_embeddings=128000,
            ),
            "vision": dict(
                depth=32,
                hidden_size=1280,
                intermediate_size=3420,
                num_heads=16,
                fullatt=(7, 15, 23, 31),
            ),
            "vae": dict(),  # AutoencoderKLQwenImage defaults = the published VAE
        },
    },
    "glm_image": {
        # _reduced_glm_text(width, layers, heads, positions, mrope), _reduced_glm_vision(
        # width, image size, patch size), then the vision vocab extra; tiny's extra 2:
        # image start / end after the codebook.
        "tiny": {
            "ar": _reduced_glm_ar(
                _reduced_glm_text(32, 1, 2, 1024, [4, 2, 2]), _reduced_glm_vision(16, 32, 8), 2
            ),
            "glyph": dict(d_model=32, d_ff=64, d_kv=16, num_heads=2, num_layers=1),
            "vae": dict(block_out_channels=[8, 8, 16, 16], layers_per_block=1, norm_num_groups=4),
        },
        "small": {
            "ar": _reduced_glm_ar(
                _reduced_glm_text(128, 2, 4, 4096, [8, 4, 4]), _reduced_glm_vision(32, 64, 16), 128
            ),
            "glyph": dict(d_model=128, d_ff=256, d_kv=32, num_heads=4, num_layers=2),
            "vae": dict(block_out_channels=[16, 32, 32, 32], layers_per_block=1, norm_num_groups=8),
        },
        "full": {
            "ar": dict(text={}, vision={}, vq={}, vision_vocab_extra=128),  # published
            "glyph": dict(d_model=1472, d_ff=3584, d_kv=64, num_heads=6, num_layers=12),
            "vae": dict(
                block_out_channels=[128, 256, 512, 512],
                layers_per_block=2,
                norm_num_groups=32,
            ),
        },
    },
}


# ---- building: meta device, then the target device with a seeded init ------------------


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


@torch.no_grad()
def seeded_init_(model: nn.Module, seed: int) -> nn.Module:
    """Deterministic init in place, one rule for every library: matrices and kernels
    ~ N(0, 1 / fan_in) (fan_in = all but the output dimension), norm scales 1, biases 0.

    N(0, 1 / fan_in) keeps activations at their scale through deep stacks (a VAE decoder's
    convolutions neither saturate nor overflow float16; 1/sqrt(3584) ~ 0.017 is a language
    model's usual 0.02). Values come from a generator on the parameters' device in float32,
    so a `full` model is initialized where it lives and the same seed gives the same
    weights on the same device type.
    """
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    if device.type == "meta":  # shapes only (parameter counts): nothing to fill
        return model
    gen = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("bias", "beta"):
                param.zero_()
            elif _is_norm(module) or leaf in ("gamma", "scale") or param.dim() < 2:
                param.fill_(1.0)
            else:
                fan_in = param[0].numel()
                values = torch.randn(param.shape, generator=gen, device=device)
                param.copy_(values.mul_(fan_in**-0.5))
    return model


def build_component(
    factory: Callable[[], nn.Module],
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> nn.Module:
    """`factory()` with its parameters on the meta device, materialized on `device`.

    Parameters are created on the meta device (accelerate's `init_empty_weights`: no host
    memory, no init cost), cast while still on meta, allocated once on `device` and
    initialized there (`seeded_init_`); a published-size model never takes a round trip
    through host float32. Buffers (rotary frequencies, position tables) are computed by the
    constructor on the host as usual, kept in the dtype the library gave them, and moved.
    """
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = factory()
    buffers = {
        name: (module, leaf, buf)
        for name, buf in model.named_buffers()
        for module, leaf in [_owner(model, name)]
    }
    for param in model.parameters():
        param.data = param.data.to(dtype)
    model = model.to_empty(device=device)
    for module, leaf, buf in buffers.values():
        module._buffers[leaf] = buf.to(device)
    seeded_init_(model, seed)
    return model.eval().requires_grad_(False)


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


def component_info(module: Any) -> dict[str, Any]:
    """`{"class": "module.Class", "parameters": n}` for a component (0 for a tokenizer)."""
    cls = type(module)
    params = sum(p.numel() for p in module.parameters()) if isinstance(module, nn.Module) else 0
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "parameters": int(params)}


# ---- tokenizers (in memory) -------------------------------------------------------------


def _train_bpe(pre_tokenizer: Any, corpus: Sequence[str], specials: Sequence[str]) -> Any:
    """A byte-level BPE trained over `corpus` until every word in it is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=100_000,
        min_frequency=1,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def _corpus(template_text: str) -> list[str]:
    words = list(WORDS) + list(string.ascii_lowercase)
    return [template_text, " ".join(words), "\n".join(words), *words]


def qwen_tokenizer() -> Any:
    """`Qwen2Tokenizer` over an in-memory byte-level vocab with Qwen's pre-tokenizer.

    Each pre-token of the prompt template is one token, so the template's prefix is the
    34 tokens diffusers' `QwenImagePipeline` drops, and each prompt word is one token.
    """
    import json

    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    shell = Qwen2Tokenizer()
    trained = _train_bpe(
        shell.backend_tokenizer.pre_tokenizer, _corpus(QWEN_PROMPT_TEMPLATE), specials
    )
    model = json.loads(trained.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    return tokenizer


# GLM-Image's special tokens (zai-org/GLM-Image processor/tokenizer_config.json names):
# the grid markers `<sop>`/`<eop>`, the image placeholder, and the visual BOS
# `<|dit_token_{image_start}|>` that the processor appends after the grids.
_GLM_SPECIALS = (
    "<sop>",
    "<eop>",
    "<|image|>",
    "[gMASK]",
    "<|user|>",
    "<|assistant|>",
    "<|endoftext|>",
)
# A GLM-4-style chat template (the checkpoint's template is not available offline); what
# the AR model reads after it is the processor's layout: prompt, target grid, preview
# grid, visual BOS.
_GLM_CHAT_TEMPLATE = (
    "[gMASK]{% for m in messages %}<|{{ m['role'] }}|>"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% else %}<|image|>{% endif %}{% endfor %}{% endfor %}<|assistant|>"
)


def glm_processor(vision_vocab_size: int, image_start: int, image_end: int) -> Any:
    """`GlmImageProcessor` over a `PreTrainedTokenizerFast` with an in-memory BPE.

    Ids `[0, vision_vocab_size)` are the visual tokens (as in GLM-Image, whose AR head
    predicts over the first ids of the text vocabulary); the trained text tokens and the
    special tokens follow.
    """
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.models.glm_image.image_processing_pil_glm_image import (
        GlmImageImageProcessorPil,
    )
    from transformers.models.glm_image.processing_glm_image import GlmImageProcessor
    from transformers.tokenization_utils_tokenizers import PreTrainedTokenizerFast

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained = json.loads(_train_bpe(pre, _corpus(""), ()).to_str())["model"]
    vocab = {f"<|dit_token_{i}|>": i for i in range(vision_vocab_size)}
    for tok, idx in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab[tok] = vision_vocab_size + idx
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in _GLM_SPECIALS])
    bos = f"<|dit_token_{image_start}|>"
    eos = f"<|dit_token_{image_end}|>"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token="<|endoftext|>",
        padding_side="left",  # GlmImagePipeline batches left-padded prompts
        extra_special_tokens={
            "image_token": "<|image|>",
            "grid_bos_token": "<sop>",
            "grid_eos_token": "<eop>",
        },
    )
    return GlmImageProcessor(
        image_processor=GlmImageImageProcessorPil(),  # text-to-image: no pixels to process
        tokenizer=tokenizer,
        chat_template=_GLM_CHAT_TEMPLATE,
    )


# ---- the components of each workload ----------------------------------------------------


def qwen_components(
    preset: str,
    *,
    text_dim: int,
    latent_channels: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> dict[str, Any]:
    """Qwen-Image's `tokenizer`, `text_encoder` (Qwen2.5-VL) and `vae` at `preset`."""
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import AutoencoderKLQwenImage
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VLForConditionalGeneration,
    )

    cfg = COMPONENT_CONFIGS["qwen_image"][preset]
    tokenizer = qwen_tokenizer()
    text = dict(cfg["text"])
    mrope = text.pop("mrope_section")
    vocab = text.pop("vocab_size") or len(tokenizer)
    if text["hidden_size"] != text_dim:
        raise ValueError(
            f"qwen_image {preset}: text encoder width {text['hidden_size']} != DiT {text_dim}"
        )
    vision = dict(cfg["vision"])
    fullatt = list(vision.pop("fullatt"))
    pad = tokenizer.pad_token_id
    config = Qwen2_5_VLConfig(
        text_config={
            **text,
            "vocab_size": vocab,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": mrope},
            "pad_token_id": pad,
            "bos_token_id": pad,
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        },
        vision_config={**vision, "out_hidden_size": text_dim, "fullatt_block_indexes": fullatt},
    )
    text_encoder = build_component(
        lambda: Qwen2_5_VLForConditionalGeneration(config),
        device=device,
        dtype=dtype,
        seed=seed + 1,
    )
    vae_kwargs = dict(cfg["vae"])
    vae = build_component(
        lambda: AutoencoderKLQwenImage(**vae_kwargs), device=device, dtype=dtype, seed=seed + 2
    )
    if vae.config.z_dim != latent_channels:
        raise ValueError(
            f"qwen_image {preset}: VAE z_dim {vae.config.z_dim} != DiT {latent_channels}"
        )
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": vae}


def glm_components(
    preset: str,
    *,
    text_dim: int,
    latent_channels: int,
    codebook_size: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> dict[str, Any]:
    """GLM-Image's `processor`, `vision_language_encoder` (the AR model), `tokenizer`,
    `text_encoder` (ByT5) and `vae` at `preset`."""
    from transformers.models.byt5.tokenization_byt5 import ByT5Tokenizer

    cfg = COMPONENT_CONFIGS["glm_image"][preset]
    vision_vocab = codebook_size + cfg["ar"]["vision_vocab_extra"]
    processor = glm_processor(vision_vocab, codebook_size, codebook_size + 1)
    build = functools.partial(build_component, device=device, dtype=dtype)
    glyph = dict(cfg["glyph"])
    if glyph["d_model"] != text_dim:
        raise ValueError(
            f"glm_image {preset}: glyph encoder width {glyph['d_model']} != DiT {text_dim}"
        )
    return {
        "processor": processor,
        "vision_language_encoder": _glm_prior(
            cfg["ar"], preset, processor, codebook_size, build, seed + 3
        ),
        "tokenizer": ByT5Tokenizer(),
        "text_encoder": _glm_glyph_encoder(glyph, build, seed + 4),
        "vae": _glm_vae(dict(cfg["vae"]), latent_channels, build, seed + 5),
    }


def _glm_prior(
    ar: dict[str, Any],
    preset: str,
    processor: Any,
    codebook_size: int,
    build: Callable[..., nn.Module],
    seed: int,
) -> nn.Module:
    """GLM-Image's AR model, whose image tokens are the codebook's ids and the two after
    it (image start, image end)."""
    from transformers.models.glm_image.configuration_glm_image import GlmImageConfig
    from transformers.models.glm_image.modeling_glm_image import GlmImageForConditionalGeneration

    image_start, image_end = codebook_size, codebook_size + 1
    vision_vocab = codebook_size + ar["vision_vocab_extra"]
    tok = processor.tokenizer
    text = dict(ar["text"])
    text.setdefault("vocab_size", 168064 if preset == "full" else len(tok))
    config = GlmImageConfig(
        text_config={
            **text,
            "vision_vocab_size": vision_vocab,
            "pad_token_id": tok.pad_token_id,
            "eos_token_id": image_end,
        },
        vision_config=dict(ar["vision"]),
        vq_config={**ar["vq"], "num_embeddings": codebook_size},
        image_token_id=tok.convert_tokens_to_ids("<|image|>"),
        image_start_token_id=image_start,
        image_end_token_id=image_end,
    )
    prior = build(lambda: GlmImageForConditionalGeneration(config), seed=seed)
    prior.generation_config.pad_token_id = tok.pad_token_id
    # Random weights put probability on every id of the AR head, including the image-end
    # token (which would stop generation early) and ids past the DiT's codebook; trained
    # weights do not. Suppressing them (transformers' `suppress_tokens`, in the generation
    # config so that diffusers' GlmImagePipeline samples the same tokens) keeps the token
    # count and the DiT's lookup those of a real request.
    prior.generation_config.suppress_tokens = list(range(codebook_size, vision_vocab))
    return prior


def _glm_glyph_encoder(
    glyph: dict[str, Any], build: Callable[..., nn.Module], seed: int
) -> nn.Module:
    """GLM-Image's ByT5 glyph encoder (a T5 encoder over bytes)."""
    from transformers.models.t5.configuration_t5 import T5Config
    from transformers.models.t5.modeling_t5 import T5EncoderModel

    t5 = T5Config(
        vocab_size=384,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
        dropout_rate=0.0,
        tie_word_embeddings=False,
        **glyph,
    )
    return build(lambda: T5EncoderModel(t5), seed=seed)


def _glm_vae(
    vae_cfg: dict[str, Any], latent_channels: int, build: Callable[..., nn.Module], seed: int
) -> nn.Module:
    """GLM-Image's VAE: diffusers' AutoencoderKL without quant convs."""
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL

    blocks = len(vae_cfg["block_out_channels"])
    return build(
        lambda: AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D"] * blocks,
            up_block_types=["UpDecoderBlock2D"] * blocks,
            latent_channels=latent_channels,
            latents_mean=[0.0] * latent_channels,
            latents_std=[1.0] * latent_channels,
            use_quant_conv=False,
            use_post_quant_conv=False,
            **vae_cfg,
        ),
        seed=seed,
    )
