"""A verifier's command line and output as they may be stored (T5), through polarproxy.redact."""

from __future__ import annotations

import shlex

from polarproxy.redact import redact_argv, redact_text


def redact_command(command: str) -> list[str]:
    """A shell command line as `['/bin/sh', '-c', LINE]`, the form it was run in, with the values of
    secret options and assignments, keys and URL passwords in LINE replaced (redact.redact_argv)."""
    try:
        argv = shlex.split(command)
    except ValueError:  # unbalanced quotes: redact it as free text
        return ["/bin/sh", "-c", redact_text(command)]
    redacted = redact_argv(argv)
    return ["/bin/sh", "-c", command if redacted == argv else shlex.join(redacted)]


def redact_output(text: str) -> str:
    """A verifier's output tail with bearer tokens, provider-shaped keys and URL passwords replaced."""
    return redact_text(text)
