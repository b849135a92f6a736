"""The certificate authority intercept mode signs provider certificates with, made once per user.

It lives in `$POLARPROXY_CA_DIR`, else `$XDG_DATA_HOME/polarproxy/ca` (`~/.local/share/polarproxy/ca`),
in mitmproxy's file layout (that folder is mitmproxy's `confdir`): `mitmproxy-ca.pem` holds the private
key and is readable by its owner only (0600, in a 0700 folder); `mitmproxy-ca-cert.pem` is the public
certificate that clients are told to trust.
"""

from __future__ import annotations

import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

from polarproxy.errors import UsageError

BASENAME = "mitmproxy"  # mitmproxy's confdir file names
CA_NAME = "polarproxy intercept CA"


def ca_dir() -> Path:
    env = os.environ.get("POLARPROXY_CA_DIR")
    if env:
        return Path(env)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "polarproxy" / "ca"


@dataclass(frozen=True, slots=True)
class CA:
    dir: Path

    @property
    def key_file(self) -> Path:
        """Private key and certificate (mitmproxy reads this one)."""
        return self.dir / f"{BASENAME}-ca.pem"

    @property
    def cert_file(self) -> Path:
        """The public certificate clients trust."""
        return self.dir / f"{BASENAME}-ca-cert.pem"


def ensure_ca(directory: Path | None = None) -> CA:
    """The CA in `directory` (default `ca_dir()`), created on first use; the key is made owner-only."""
    ca = CA(directory or ca_dir())
    if not ca.key_file.exists():
        from mitmproxy.certs import CertStore

        try:
            ca.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            CertStore.create_store(ca.dir, BASENAME, 2048, organization="polarproxy", cn=CA_NAME)
        except OSError as e:
            raise UsageError(
                f"Cannot create the intercept CA in {ca.dir}: {e.strerror}.",
                hint="Set POLARPROXY_CA_DIR to a writable folder.",
            ) from e
    for path, mode in ((ca.dir, 0o700), (ca.key_file, 0o600)):
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            path.chmod(mode)  # never leave the key readable by others, even if created by hand
    if not ca.cert_file.exists():
        raise UsageError(
            f"The CA folder {ca.dir} has a key but no {ca.cert_file.name}.",
            hint=f"Remove {ca.dir} to make a new CA, or set POLARPROXY_CA_DIR to another folder.",
        )
    return ca


def default_bundle() -> Path | None:
    """The CA bundle this machine's OpenSSL (and so Python and curl) trusts by default, if any."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    try:
        import certifi

        return Path(certifi.where())
    except ImportError:
        return None


def install_hint(ca: CA) -> str:
    """How to make other programs (or a whole machine) trust the CA."""
    cert = ca.cert_file
    return f"""polarproxy intercept CA: {cert}
(private key: {ca.key_file}, readable by its owner only; never share it)

`polarproxy record --intercept -- CMD` sets all of these for CMD by itself. To trust the CA elsewhere:

  Node.js         export NODE_EXTRA_CA_CERTS={cert}
  Python/OpenSSL  export SSL_CERT_FILE=BUNDLE   (BUNDLE: your system bundle with {cert.name} appended)
  requests        export REQUESTS_CA_BUNDLE=BUNDLE
  curl            export CURL_CA_BUNDLE=BUNDLE   (or curl --cacert {cert})
  Debian/Ubuntu   sudo cp {cert} /usr/local/share/ca-certificates/polarproxy.crt && sudo update-ca-certificates
  Fedora/RHEL     sudo cp {cert} /etc/pki/ca-trust/source/anchors/polarproxy.pem && sudo update-ca-trust
  macOS           sudo security add-trusted-cert -d -r trustRoot -k /Library/Keychains/System.keychain {cert}

Make BUNDLE with: cat {default_bundle() or "/etc/ssl/certs/ca-certificates.crt"} {cert} > bundle.pem
Then route traffic with HTTPS_PROXY=http://HOST:PORT (see docs/ci-recipe.md)."""
