"""Interop: sglang's baseline files and performance logs, diffusers pipelines.

`sglang` is pure Python; `diffusers` times a saved diffusers pipeline and imports torch.
"""
