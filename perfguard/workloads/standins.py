"""Stand-ins for the parts of a text-to-image pipeline that are not the DiT.

perfguard measures the DiT forward paths for real (`qwen_image.py`, `glm_image.py`); the
text encoder (Qwen2.5-VL for Qwen-Image, the glyph T5 for GLM-Image), GLM-Image's
autoregressive prior-token model and the VAE decoder are replaced by these modules. They
are *honest stand-ins*: real tensor work of configurable cost with the right output shapes
and dtypes, seeded and deterministic, so every stage has a measurable, stable time and the
pipeline's data flow is the real one. Their absolute times are not those of the real
models, and a baseline's figures for these stages say nothing about the real encoders.
"""

from __future__ import annotations

import torch
from torch import nn


class StandInTextEncoder(nn.Module):
    """Token embedding, `num_layers` pre-norm residual MLP blocks, projection to `out_dim`.

    Output: `[B, T, out_dim]` prompt embeddings, as the real encoder's last hidden state
    (after the pipeline drops the chat-template prefix).
    """

    def __init__(self, out_dim: int, hidden: int = 64, num_layers: int = 1, vocab: int = 1024):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(hidden),
                nn.Linear(hidden, 4 * hidden),
                nn.GELU(approximate="tanh"),
                nn.Linear(4 * hidden, hidden),
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(hidden)
        self.proj = nn.Linear(hidden, out_dim)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(token_ids)
        for block in self.blocks:
            x = x + block(x)
        return self.proj(self.norm(x))


class StandInPriorTokenModel(nn.Module):
    """GLM-Image's autoregressive prior: one token per step over the VQ codebook.

    The real model (a 9B GLM vision-language decoder) generates image tokens on a 32x
    downsampled grid, one at a time, then the pipeline upsamples them 2x to the DiT's 16x
    grid. This stand-in keeps that shape of work: a sequential loop with a recurrent state,
    a greedy argmax over `codebook_size` logits per token, everything on the device (the
    argmax feeds the next step's embedding lookup without a host round trip).
    """

    def __init__(self, codebook_size: int, text_dim: int, hidden: int = 64):
        super().__init__()
        self.codebook_size = codebook_size
        self.text_in = nn.Linear(text_dim, hidden)
        self.token_embed = nn.Embedding(codebook_size, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.head = nn.Linear(hidden, codebook_size)

    def forward(self, text: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
        """`text` `[B, T, text_dim]` -> prior token ids `[B, (2*grid_h) * (2*grid_w)]`."""
        batch = text.shape[0]
        state = torch.tanh(self.text_in(text.mean(dim=1)))
        token = torch.zeros(batch, dtype=torch.long, device=text.device)
        tokens = []
        for _ in range(grid_h * grid_w):
            state = self.cell(self.token_embed(token).to(state.dtype), state)
            token = self.head(state).argmax(dim=-1)
            tokens.append(token)
        ids = torch.stack(tokens, dim=1).view(batch, 1, grid_h, grid_w)
        # diffusers' GlmImagePipeline._upsample_token_ids: nearest 2x, 32x grid -> 16x grid.
        ids = nn.functional.interpolate(ids.float(), scale_factor=2, mode="nearest").long()
        return ids.view(batch, -1)


class StandInVaeDecoder(nn.Module):
    """Latents `[B, C, h, w]` -> image `[B, 3, 8h, 8w]` in [-1, 1]: three 2x upsampling
    levels of `num_layers` 3x3 conv + SiLU each, like the real decoder's up blocks."""

    def __init__(self, latent_channels: int, channels: int = 16, num_layers: int = 1):
        super().__init__()
        self.conv_in = nn.Conv2d(latent_channels, channels, 3, padding=1)
        levels = []
        for _ in range(3):
            layers: list[nn.Module] = [nn.Upsample(scale_factor=2.0, mode="nearest")]
            for _ in range(num_layers):
                layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.SiLU()]
            levels.append(nn.Sequential(*layers))
        self.up = nn.Sequential(*levels)
        self.conv_out = nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv_out(self.up(self.conv_in(latents))))
