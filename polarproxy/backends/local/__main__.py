"""`python -m polarproxy.backends.local MODEL_DIR`: run the local backend (prints the port once ready)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polarproxy.backends.local.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m polarproxy.backends.local", description=__doc__)
    parser.add_argument("model_dir", type=Path, help="model folder (transformers format)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--max-new-tokens-limit", type=int, default=None)
    args = parser.parse_args(argv)

    def ready(port: int) -> None:
        print(json.dumps({"host": args.host, "port": port}), flush=True)

    serve(
        args.model_dir,
        args.host,
        args.port,
        weight_version=args.weight_version,
        max_new_tokens_limit=args.max_new_tokens_limit,
        ready=ready,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
