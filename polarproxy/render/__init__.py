"""Tokenizer and chat template: conversations to prompt token IDs, sampled tokens back to a completion."""
