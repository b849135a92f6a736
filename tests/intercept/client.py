"""A plain httpx client: `python client.py PLAN.json OUT.json` sends each request (through HTTPS_PROXY,
trusting SSL_CERT_FILE, as any Python client in a harness would) and writes what came back."""

from __future__ import annotations

import base64
import json
import sys

import httpx


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.loads(f.read())
    results = []
    with httpx.Client(timeout=30) as client:
        for item in plan:
            body = json.dumps(item["json"]).encode() if "json" in item else None
            headers = {**item["headers"], **({"content-type": "application/json"} if body else {})}
            got: list[bytes] = []
            res: dict = {"name": item["name"]}
            try:
                with client.stream(item["method"], item["url"], headers=headers, content=body) as r:
                    res["status"] = r.status_code
                    for chunk in r.iter_raw():
                        got.append(chunk)
            except httpx.HTTPError as e:
                res.update(error=type(e).__name__, detail=str(e))
            res["body"] = base64.b64encode(b"".join(got)).decode()
            results.append(res)
    with open(sys.argv[2], "w") as f:
        f.write(json.dumps(results))


if __name__ == "__main__":
    main()
