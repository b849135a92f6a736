"""polarproxy: record the exact tokens a model saw and sampled inside unmodified agent harnesses."""

__version__ = "0.1.0"
