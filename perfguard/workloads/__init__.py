"""Workload models for perfguard: plain-``torch.nn.Module`` re-implementations of diffusers
transformers (parameter-name compatible) plus the serving optimizations perfguard gates.

Modules:
    attention  -- shared RoPE / dense SDPA / varlen (packed) joint-attention helpers
    graphs     -- ``breakable_cuda_graph()`` capture-region flag
    qwen_image -- ``QwenImageTransformer2DModel``
    glm_image  -- ``GlmImageTransformer2DModel``
    presets    -- ``tiny`` / ``small`` / ``full`` configs and ``build_model``
    components -- the pipelines' real text encoders, AR prior, VAEs, tokenizers, schedulers
    pipeline   -- sglang-staged text-to-image pipelines, diffusers' loop
"""
