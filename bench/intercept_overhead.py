"""What intercept mode adds: a client through `polarproxy record --intercept` vs the same client direct.

    python bench/intercept_overhead.py [--quick] [--calls N] [--json OUT]

One provider stand-in (tests/intercept/standin.py: api.openai.com on loopback, a certificate from a CA made
here, its own process) answers a chat completion as JSON, or streamed as SSE with a short pause between
chunks. The client is one process run as the child of `polarproxy record --intercept` (so it gets the
proxy variables and the CA bundle exactly as a harness does) and holds two httpx clients side by side:

  direct     TLS straight to the stand-in (SNI api.openai.com, the test CA trusted), no proxy
  intercept  through HTTPS_PROXY: TLS to polarproxy (its CA), which records the call and opens its own
             TLS to the stand-in (`--resolve`, `--upstream-ca`)

Both keep their connections alive. Requests interleave (the order shuffled per round) so machine noise hits
both alike. Reported: p50/p99 of the whole call (JSON) and of the time to the first streamed chunk (TTFT),
each as added milliseconds over direct in the same run; then every call is checked to be in the store.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "intercept"))

HOST = "api.openai.com"
TARGETS = ("direct", "mitmproxy", "intercept")
WARMUP = 5
PATH = "/v1/chat/completions"
GOAL_ADDED_P50_MS = 5.0  # the target, per call, TLS on both legs
BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello."}]}


def _cpu_s(pid: int) -> float:
    """utime + stime of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def serve_standin(ca_dir: Path) -> None:
    """Child process: the stand-in; prints its port, serves until stdin closes."""
    from standin import StandIn, TestCA

    ca = TestCA(ca_dir / "test-ca.pem", ca_dir / "server.pem", ca_dir / "server-key.pem")
    server = StandIn(ca, delay=0.001)
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


BARE_ADDON = """
from mitmproxy import ctx
def load(loader):
    loader.add_option("bench_target", str, "", "ADDR:PORT to dial for every server connection")
def server_connect(data):
    addr, _, port = ctx.options.bench_target.rpartition(":")
    data.server.sni = data.server.sni or data.server.address[0]
    data.server.address = (addr, int(port))
def responseheaders(flow):
    if "text/event-stream" in flow.response.headers.get("content-type", ""):
        flow.response.stream = True  # as DESIGN.md 8 says; left alone, mitmproxy buffers the whole stream
"""


def start_bare_mitmproxy(tmp: Path, port: int, test_ca: Path, ca_dir: Path) -> tuple[subprocess.Popen, int]:
    """A bare mitmdump in regular mode: the same CA, upstream trust and dialing as polarproxy, SSE streamed
    through, no recording."""
    script = tmp / "bare_addon.py"
    script.write_text(BARE_ADDON)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = s.getsockname()[1]
    cmd = [str(Path(sys.executable).parent / "mitmdump"), "-q", "--listen-host", "127.0.0.1"]
    cmd += ["--listen-port", str(listen), "-s", str(script), "--set", f"bench_target=127.0.0.1:{port}"]
    cmd += ["--set", f"confdir={ca_dir}", "--set", f"ssl_verify_upstream_trusted_ca={test_ca}"]
    proc = subprocess.Popen(cmd)
    for _ in range(400):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", listen)) == 0:
                return proc, listen
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("mitmdump did not start")


def run_client(port: int, calls: int, out: Path, test_ca: Path, bare_port: int, bare_pid: int) -> None:
    """Child of `record --intercept`: time the three paths, interleaved, and write the samples."""
    import httpx

    direct = httpx.Client(verify=ssl.create_default_context(cafile=str(test_ca)), trust_env=False, timeout=30)
    intercept = httpx.Client(timeout=30)  # HTTPS_PROXY and SSL_CERT_FILE from record --intercept
    bare = httpx.Client(
        proxy=f"http://127.0.0.1:{bare_port}",
        verify=ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]),
        trust_env=False,
        timeout=30,
    )
    clients = {"direct": direct, "mitmproxy": bare, "intercept": intercept}

    def once(client: httpx.Client, stream: bool) -> tuple[float, float]:
        body = json.dumps({**BODY, "stream": stream}).encode()
        headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
        if client is direct:
            req = client.build_request(
                "POST",
                f"https://127.0.0.1:{port}{PATH}",
                headers={**headers, "host": HOST},
                content=body,
                extensions={"sni_hostname": HOST},
            )
        else:
            req = client.build_request("POST", f"https://{HOST}{PATH}", headers=headers, content=body)
        t0 = time.perf_counter()
        r = client.send(req, stream=True)
        first = None
        for _ in r.iter_raw():
            if first is None:
                first = time.perf_counter()
        r.close()
        end = time.perf_counter()
        assert r.status_code == 200, r.status_code
        return (end - t0) * 1000, ((first or end) - t0) * 1000

    samples: dict[str, list[float]] = {f"{t}_{k}": [] for t in TARGETS for k in ("latency", "ttft")}
    for _ in range(WARMUP):  # connections, TLS sessions, certificate generation
        for client in clients.values():
            once(client, False)
            once(client, True)
    order = list(TARGETS)
    cpu0 = {"intercept": _cpu_s(os.getppid()), "mitmproxy": _cpu_s(bare_pid)}
    for _ in range(calls):
        random.shuffle(order)
        for name in order:
            samples[f"{name}_latency"].append(once(clients[name], False)[0])
        random.shuffle(order)
        for name in order:
            samples[f"{name}_ttft"].append(once(clients[name], True)[1])
    cpu = {
        "intercept": _cpu_s(os.getppid()) - cpu0["intercept"],  # the `record --intercept` process
        "mitmproxy": _cpu_s(bare_pid) - cpu0["mitmproxy"],
    }
    out.write_text(json.dumps({**samples, "cpu_s": cpu}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="Calls per target and kind (JSON, streamed).")
    ap.add_argument("--quick", action="store_true", help="30 calls: a smoke run.")
    ap.add_argument("--json", type=Path, help="Write the figures here.")
    ap.add_argument("--profile", type=Path, help="cProfile the polarproxy process into this file.")
    ap.add_argument("--serve-standin", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_standin:
        serve_standin(args.serve_standin)
        return 0
    if args.client:
        port, calls, out, ca, bare_port, bare_pid = args.client
        run_client(int(port), int(calls), Path(out), Path(ca), int(bare_port), int(bare_pid))
        return 0
    calls = 30 if args.quick else args.calls

    from standin import OTHER_HOST, PROVIDER_HOSTS, TestCA

    from polarproxy.capture.intercept.ca import ensure_ca
    from polarproxy.store.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="pp-intercept-bench-"))
    ca = TestCA.make(tmp / "test-ca", (*PROVIDER_HOSTS, OTHER_HOST))
    standin = subprocess.Popen(
        [sys.executable, __file__, "--serve-standin", str(tmp / "test-ca")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    bare: subprocess.Popen | None = None
    try:
        port = int(standin.stdout.readline())  # type: ignore[union-attr]
        ensure_ca(tmp / "ca")
        bare, bare_port = start_bare_mitmproxy(tmp, port, ca.cert, tmp / "ca")
        db = tmp / "bench.db"
        env = {**os.environ, "POLARPROXY_CA_DIR": str(tmp / "ca")}
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
            env.pop(name, None)
        samples_file = tmp / "samples.json"
        cmd = [sys.executable, *(["-m", "cProfile", "-o", str(args.profile)] if args.profile else [])]
        cmd += ["-m", "polarproxy", "record", "--intercept", "--db", str(db)]
        cmd += [
            "--resolve",
            f"{HOST}=127.0.0.1:{port}",
            "--upstream-ca",
            str(ca.cert),
            "--json-out",
            str(tmp / "summary.json"),
            "--",
        ]
        cmd += [sys.executable, __file__, "--client", str(port), str(calls), str(samples_file), str(ca.cert)]
        cmd += [str(bare_port), str(bare.pid)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
            return 1
        samples = json.loads(samples_file.read_text())
        summary = json.loads((tmp / "summary.json").read_text())
        recorded = Store.open(str(db)).list_calls(summary["episode_id"])
    finally:
        standin.stdin.close()  # type: ignore[union-attr]
        standin.wait(10)
        if bare is not None:
            bare.terminate()
            bare.wait(10)
    expected = (calls + WARMUP) * 2  # JSON and streamed, warm-up included
    ok = sum(c.status == "ok" for c in recorded)
    figures: dict[str, Any] = {"calls_per_kind": calls, "recorded_ok": ok, "recorded_expected": expected}
    # CPU per call over the measured calls (warm-up excluded), which the machine's load changes less.
    figures["cpu_ms_per_call"] = {t: v * 1000 / (2 * calls) for t, v in samples["cpu_s"].items()}
    print(f"intercept overhead, {calls} calls per kind, TLS on both legs (ms; added = over direct, same run)")
    print(f"{'':20}{'target':>11}{'p50':>9}{'added p50':>11}{'p99':>9}{'added p99':>11}")
    for kind, label in (("latency", "whole call (JSON)"), ("ttft", "first chunk (SSE)")):
        d = samples[f"direct_{kind}"]
        figures[kind] = {}
        for target in TARGETS:
            x = samples[f"{target}_{kind}"]
            row = {
                "p50_ms": statistics.median(x),
                "p99_ms": _pct(x, 0.99),
                "added_p50_ms": statistics.median(x) - statistics.median(d),
                "added_p99_ms": _pct(x, 0.99) - _pct(d, 0.99),
            }
            figures[kind][target] = row
            head = label if target == TARGETS[0] else ""
            print(
                f"{head:20}{target:>11}{row['p50_ms']:9.2f}{row['added_p50_ms']:11.2f}"
                f"{row['p99_ms']:9.2f}{row['added_p99_ms']:11.2f}"
            )
    cpu = figures["cpu_ms_per_call"]
    print(f"proxy CPU per call: mitmproxy {cpu['mitmproxy']:.2f} ms, intercept {cpu['intercept']:.2f} ms")
    added = figures["latency"]["intercept"]["added_p50_ms"]
    figures["goal_added_p50_ms"] = GOAL_ADDED_P50_MS
    figures["goal_met"] = added <= GOAL_ADDED_P50_MS
    print(
        f"goal: added p50 <= {GOAL_ADDED_P50_MS} ms per call: {'met' if figures['goal_met'] else 'NOT met'}"
    )
    print(f"recorded == sent: {ok} ok of {expected}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if ok == expected else 1


if __name__ == "__main__":
    sys.exit(main())
