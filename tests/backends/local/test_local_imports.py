"""Importing the local backend and the tiny kit stays light: torch and transformers load on use."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_local_backend_and_tiny_kit_does_not_import_torch():
    code = (
        "import sys\n"
        "import polarproxy.backends.local, polarproxy.backends.local.server, polarproxy.backends.local.model_runner\n"
        "import polarproxy.tiny, polarproxy.tiny.script, polarproxy.tiny.template\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
