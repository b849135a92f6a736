"""The local backend: an SGLang-compatible `/generate` server over a transformers model (CPU or GPU).

Light to import: torch and transformers load only when a `ModelRunner` is created.
"""
