"""Intercept mode: the harness keeps its real provider, polarproxy records the traffic as it passes (MITM)."""
