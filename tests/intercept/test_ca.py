"""The intercept CA: made once under the data dir, key readable by its owner only; `polarproxy ca`."""

from __future__ import annotations

import stat

from typer.testing import CliRunner

from polarproxy.capture.intercept.ca import ca_dir, ensure_ca
from polarproxy.cli import app


def test_ca_is_made_once_under_the_data_dir_with_an_owner_only_key(tmp_path, monkeypatch):
    monkeypatch.delenv("POLARPROXY_CA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert ca_dir() == tmp_path / "polarproxy" / "ca"
    ca = ensure_ca()
    assert stat.S_IMODE(ca.key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(ca.dir.stat().st_mode) == 0o700
    first = ca.cert_file.read_bytes()
    assert ensure_ca().cert_file.read_bytes() == first  # reused, not remade


def test_a_key_left_readable_by_others_is_made_owner_only(tmp_path):
    ca = ensure_ca(tmp_path / "ca")
    ca.key_file.chmod(0o644)
    ensure_ca(tmp_path / "ca")
    assert stat.S_IMODE(ca.key_file.stat().st_mode) == 0o600


def test_ca_commands_print_the_path_and_how_to_trust_it(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARPROXY_CA_DIR", str(tmp_path / "ca"))
    r = CliRunner().invoke(app, ["ca", "path"])
    assert r.exit_code == 0 and r.stdout.strip() == str(tmp_path / "ca" / "mitmproxy-ca-cert.pem")
    r = CliRunner().invoke(app, ["ca", "install-hint"])
    assert r.exit_code == 0
    assert "NODE_EXTRA_CA_CERTS=" in r.stdout and "update-ca-certificates" in r.stdout


def test_intercept_options_without_intercept_are_a_usage_error(tmp_path):
    r = CliRunner().invoke(app, ["record", "--resolve", "a=127.0.0.1:1", "--", "true"])
    assert r.exit_code == 2 and "go with --intercept" in r.output


def test_a_bad_resolve_names_the_form(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARPROXY_CA_DIR", str(tmp_path / "ca"))
    r = CliRunner().invoke(
        app, ["record", "--intercept", "--db", str(tmp_path / "x.db"), "--resolve", "nope", "--", "true"]
    )
    assert r.exit_code == 1 and "Bad --resolve 'nope'" in r.output and "HOST=ADDRESS:PORT" in r.output
