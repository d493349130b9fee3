"""OpenTela: one OpenAI-compatible endpoint over a peer-to-peer mesh of transient serving nodes."""

__version__ = "0.1.0"
