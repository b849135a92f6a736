"""Inference backends: SGLang /generate (and the local server that speaks it)."""
