"""The environment that routes a child's HTTPS through the intercept proxy and makes it trust the CA.

`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE` and `CURL_CA_BUNDLE` replace a client's whole trust store, so they
point at a bundle of what the child trusted before (its own setting, else the system bundle) plus the
polarproxy CA: traffic that is not intercepted keeps working. `NODE_EXTRA_CA_CERTS` adds to Node's own
roots, so it is the CA (plus any extra file the child already named). `NO_PROXY` is left as it is, so
hosts listed there bypass the proxy. `NODE_USE_ENV_PROXY=1` makes Node's built-in fetch use the proxy
variables on Node versions that support it (24+; older ones ignore it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from polarproxy.capture.intercept.ca import CA, default_bundle
from polarproxy.harness.env import without_host_secrets

PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def _read(path: str | Path | None) -> bytes:
    if not path:
        return b""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return b""
    return data if data.endswith(b"\n") or not data else data + b"\n"


def write_bundles(base: Mapping[str, str], ca: CA, out: Path) -> tuple[Path, Path]:
    """(bundle for OpenSSL-style clients, extra certs for Node), written under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    ours = _read(ca.cert_file)
    seen: list[bytes] = []
    for name in BUNDLE_VARS:
        data = _read(base.get(name))
        if data and data not in seen:
            seen.append(data)
    if not seen:
        seen.append(_read(default_bundle()))
    bundle = out / "ca-bundle.pem"
    bundle.write_bytes(b"".join(seen) + ours)
    node = out / "node-extra-ca.pem"
    node.write_bytes(_read(base.get("NODE_EXTRA_CA_CERTS")) + ours)
    return bundle, node


def intercept_env(base: Mapping[str, str], proxy_url: str, bundle: Path, node_extra: Path) -> dict[str, str]:
    env = without_host_secrets(base)
    env.update({name: proxy_url for name in PROXY_VARS})
    env.update({name: str(bundle) for name in BUNDLE_VARS})
    env["NODE_EXTRA_CA_CERTS"] = str(node_extra)
    env.setdefault("NODE_USE_ENV_PROXY", "1")
    return env
