"""`polarproxy view` as a server: loopback only, read-only, and its payloads are the CLI's own figures."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner
from view_fixtures import Built, ViewServer

from polarproxy.cli import app
from polarproxy.loopback import is_loopback
from polarproxy.view.server import bind


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "example.com"])
def test_view_refuses_a_host_that_is_not_loopback(built: Built, host: str):
    res = CliRunner().invoke(app, ["view", "--db", str(built.db), "--host", host, "--port", "0"])
    assert res.exit_code == 2, res.output
    assert "not a loopback address" in res.output
    with pytest.raises(ValueError, match="loopback"):
        bind(host, 0)


def test_loopback_names_are_the_only_hosts_allowed():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "localhost.example.com", ""))


def _listening_addresses(port: int) -> list[str]:
    """The local addresses of the sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(name)
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            addr, hex_port = cols[1].split(":")
            if int(hex_port, 16) == port and cols[3] == "0A":  # 0A: LISTEN
                found.append(addr)
    return found


def test_server_listens_on_loopback_only(view_server: ViewServer):
    url = httpx.URL(view_server.url)
    assert url.host == "127.0.0.1"
    addresses = _listening_addresses(url.port or 0)
    if not Path("/proc/net/tcp").is_file():
        pytest.skip("no /proc/net/tcp to read the listening address from")
    assert addresses == ["0100007F"]  # 127.0.0.1, little-endian hex: not 0.0.0.0 (00000000)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/", "/api/episodes", "/api/episode/x", "/static/app.js", "/nowhere"])
def test_writes_are_refused_with_405(view_server: ViewServer, method: str, path: str):
    r = httpx.request(method, view_server.url.rstrip("/") + path, json={"reward": 1})
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, HEAD"
    assert "read-only" in r.json()["error"]


def test_a_refused_write_changes_nothing(view_server: ViewServer, built: Built, cli_json):
    before = cli_json("show", built.main)
    r = httpx.post(view_server.url + f"api/episode/{built.main}", json={"reward": 0.0})
    assert r.status_code == 405
    assert cli_json("show", built.main) == before


def test_a_host_header_that_is_not_loopback_is_refused(view_server: ViewServer):
    r = httpx.get(view_server.url + "api/episodes", headers={"Host": "attacker.example:80"})
    assert r.status_code == 400
    assert httpx.get(view_server.url + "api/episodes", headers={"Host": "localhost"}).status_code == 200


def test_page_and_assets_are_served_with_a_strict_policy(view_server: ViewServer):
    page = httpx.get(view_server.url)
    assert page.status_code == 200 and "static/app.js" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    js = httpx.get(view_server.url + "static/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert httpx.get(view_server.url + "static/secret.py").status_code == 404


def _get(server: ViewServer, path: str):
    r = httpx.get(server.url.rstrip("/") + path, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_episode_list_is_ls_json(view_server: ViewServer, cli_json):
    assert _get(view_server, "/api/episodes")["episodes"] == cli_json("ls")


def test_episode_calls_are_show_json(view_server: ViewServer, built: Built, cli_json):
    shown = cli_json("show", built.main)
    got = _get(view_server, f"/api/episode/{built.main}")
    assert got["episode"] == shown["episode"]
    assert [{k: row[k] for k in shown["calls"][0]} for row in got["calls"]] == shown["calls"]
    assert got["calls"][2]["render_note"].startswith("message 0 differs")
    assert got["rewards"][-1]["source"] == "command" and got["rewards"][-1]["command"] == ["pytest", "-q"]


def test_call_tokens_are_show_json_tokens(view_server: ViewServer, built: Built, cli_json):
    shown = {c["id"]: c for c in cli_json("show", built.main, "--tokens")["calls"]}
    for cid in built.main_calls:
        call = _get(view_server, f"/api/call/{cid}")["call"]
        for key in ("prompt_ids", "output_ids", "output_logprobs", "prompt_tokens", "output_tokens"):
            assert call[key] == shown[cid][key], key


def test_missing_things_are_404_with_a_hint(view_server: ViewServer, built: Built):
    for path in ("/api/episode/ep_nope", "/api/call/call_nope", f"/api/trajectory/{built.main}/9"):
        r = httpx.get(view_server.url.rstrip("/") + path)
        assert r.status_code == 404
        assert r.json()["error"] and r.json()["hint"]


def test_audit_is_audit_json(view_server: ViewServer, built: Built, cli_json):
    shown = cli_json("audit", built.main)["episodes"][0]
    got = _get(view_server, f"/api/audit/{built.main}")
    assert got["audit"] == shown
    drifted = [c for c in shown["per_call"] if c["result"] == "drifted"]
    assert drifted, "the test episode has a call whose sampled tokens the template does not reproduce"
    for c in drifted:
        window = got["windows"][c["call_id"]]
        assert window["first_diff"] == c["first_diff"]
        assert (
            window["recorded"][: c["first_diff"] - window["start"]]
            == window["fresh"][: c["first_diff"] - window["start"]]
        )


def test_group_advantages_are_the_exports(view_server: ViewServer, built: Built, tmp_path: Path):
    out = tmp_path / "rows.jsonl"
    res = CliRunner().invoke(
        app,
        ["export", "--db", str(built.db), "--out", str(out), "--advantages", "grpo"],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    exported = {}
    for line in out.read_text().splitlines():
        row = json.loads(line)
        exported[row["episode_id"]] = row["advantage"]
    got = _get(view_server, "/api/groups")
    shown = {e["id"]: e["advantage"] for g in got["groups"] for e in g["episodes"]}
    assert {k: v for k, v in shown.items() if v is not None} == exported
    g2 = next(g for g in got["groups"] if g["key"] == "group:g2")
    assert g2["zero_variance"] and all(e["advantage"] is None for e in g2["episodes"])


def test_metrics_are_the_train_folders(view_server: ViewServer, built: Built):
    from polarproxy.train.metrics import read_metrics

    assert _get(view_server, "/api/metrics")["rows"] == read_metrics(built.metrics_dir)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_bind_listens_on_the_loopback_address_given(host: str):
    try:
        sock = bind(host, 0)
    except OSError as e:  # a machine without IPv6 on lo
        pytest.skip(f"cannot bind {host}: {e}")
    try:
        assert is_loopback(sock.getsockname()[0])
    finally:
        sock.close()
