"""perfguard: performance-regression gate and baseline manager for diffusion-model serving."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
