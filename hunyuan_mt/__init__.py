"""Hunyuan-MT translation server: one shared backbone, per-pair LoRA adapters, pivot routing."""

__version__ = "0.1.0"
