"""Loopback HTTPS stand-ins for the providers, under their real host names, with a CA the test makes.

`TestCA.make(dir)` writes a CA and one server certificate for the provider hosts (plus OTHER_HOST, a
host polarproxy must not record); `StandIn(ca)` serves each provider's canned answers (JSON or SSE) on
127.0.0.1 and records what it received. A request header `x-standin` picks a fault: `drop` (half the
stream, then the socket closes), `notjson` (200 with an HTML body), `error` (429 in the provider's shape),
`slow` (a one-second pause after the first streamed chunk).
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PROVIDER_HOSTS = ("api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com")
OTHER_HOST = "downloads.example.test"
CUSTOM_HOST = "llm.internal.test"  # an OpenAI-compatible gateway of the user's (recorded with --host only)


@dataclass(frozen=True)
class TestCA:
    __test__ = False  # not a test class
    cert: Path  # the CA certificate (what a client or polarproxy's --upstream-ca trusts)
    server_cert: Path
    server_key: Path

    @staticmethod
    def make(out: Path, hosts: tuple[str, ...] = (*PROVIDER_HOSTS, OTHER_HOST, CUSTOM_HOST)) -> TestCA:
        out.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "polarproxy test CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        paths = TestCA(out / "test-ca.pem", out / "server.pem", out / "server-key.pem")
        paths.cert.write_bytes(ca.public_bytes(pem))
        paths.server_cert.write_bytes(leaf.public_bytes(pem))
        paths.server_key.write_bytes(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
        return paths


def _sse(events: list[tuple[str | None, Any]]) -> list[bytes]:
    out = []
    for name, data in events:
        body = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "").encode() + f"data: {body}\n\n".encode())
    return out


CHAT_JSON = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "ls", "arguments": '{"path": "."}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 21, "completion_tokens": 7, "total_tokens": 28},
}


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


CHAT_SSE = _sse(
    [
        (None, _chat_chunk({"role": "assistant", "content": ""})),
        (None, _chat_chunk({"content": "Hel"})),
        (None, _chat_chunk({"content": "lo there."})),
        (None, _chat_chunk({}, "stop")),
        (
            None,
            {
                "id": "chatcmpl-2",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": "gpt-4o-2024-08-06",
                "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            },
        ),
        (None, "[DONE]"),
    ]
)

RESPONSE_OBJ = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1700000000,
    "status": "completed",
    "model": "gpt-5-2025-08-07",
    "output": [
        {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "The user greets me."}],
            "encrypted_content": "gAAAAenc",
        },
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hi!", "annotations": []}],
        },
    ],
    "usage": {"input_tokens": 30, "output_tokens": 9, "total_tokens": 39},
}
RESPONSES_SSE = _sse(
    [
        (
            "response.created",
            {"type": "response.created", "response": {**RESPONSE_OBJ, "status": "in_progress", "output": []}},
        ),
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": RESPONSE_OBJ["output"][0]},
        ),
        (
            "response.output_text.delta",
            {"type": "response.output_text.delta", "output_index": 1, "delta": "Hi"},
        ),
        (
            "response.output_text.delta",
            {"type": "response.output_text.delta", "output_index": 1, "delta": "!"},
        ),
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 1, "item": RESPONSE_OBJ["output"][1]},
        ),
        ("response.completed", {"type": "response.completed", "response": RESPONSE_OBJ}),
    ]
)

ANTHROPIC_JSON = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {"type": "thinking", "thinking": "List the files.", "signature": "sig-abc"},
        {"type": "text", "text": "Listing."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
    ],
    "stop_reason": "tool_use",
    "usage": {"input_tokens": 40, "cache_read_input_tokens": 100, "output_tokens": 25},
}
ANTHROPIC_SSE = _sse(
    [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **ANTHROPIC_JSON,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 40, "cache_read_input_tokens": 100, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "List the files."},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "signature_delta", "signature": "sig-abc"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("ping", {"type": "ping"}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "List"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ing."}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": '{"comm'},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": 'and": "ls"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 25}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
)

GEMINI_JSON = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [
                    {"text": "Weighing it.", "thought": True},
                    {"text": "Reading it."},
                    {
                        "functionCall": {"name": "read_file", "args": {"path": "README.md"}},
                        "thoughtSignature": "c2ln",
                    },
                ],
            },
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 50,
        "candidatesTokenCount": 11,
        "thoughtsTokenCount": 4,
        "totalTokenCount": 65,
    },
    "modelVersion": "gemini-2.5-pro",
    "responseId": "gem-1",
}
GEMINI_SSE = _sse(
    [
        (
            None,
            {
                "candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}, "index": 0}],
                "modelVersion": "gemini-2.5-flash",
                "responseId": "gem-2",
            },
        ),
        (
            None,
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": [{"text": "lo."}]},
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 2, "totalTokenCount": 10},
                "modelVersion": "gemini-2.5-flash",
                "responseId": "gem-2",
            },
        ),
    ]
)

ERRORS = {
    "api.openai.com": {
        "error": {"message": "Rate limit reached", "type": "rate_limit_error", "code": "rate_limit"}
    },
    "api.anthropic.com": {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Rate limit reached"},
    },
    "generativelanguage.googleapis.com": {
        "error": {"code": 429, "message": "Rate limit reached", "status": "RESOURCE_EXHAUSTED"}
    },
}
NOT_JSON = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"
OTHER_BODY = b"not a model endpoint: just a file\n"


ANTHROPIC_DONE = {**ANTHROPIC_JSON, "content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn"}
ANTHROPIC_DONE_SSE = _sse(
    [
        (
            "message_start",
            {"type": "message_start", "message": {**ANTHROPIC_DONE, "content": [], "stop_reason": None}},
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Done."}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
)


def canned(host: str, path: str, body: dict[str, Any], *, text_only: bool = False) -> tuple[str, list[bytes]]:
    """(content type, chunks) of the answer for a request; chunks are sent with a flush between each.
    `text_only`: Anthropic answers are a plain final answer (for real harnesses, which would act on tools)."""
    stream = bool(body.get("stream")) or ":streamGenerateContent" in path
    if text_only and path.startswith("/v1/messages"):
        return (
            ("text/event-stream", ANTHROPIC_DONE_SSE)
            if stream
            else ("application/json", [json.dumps(ANTHROPIC_DONE).encode()])
        )
    if host == OTHER_HOST:
        return "text/plain", [OTHER_BODY]
    if path.startswith("/v1/chat/completions"):
        return (
            ("text/event-stream", CHAT_SSE)
            if stream
            else ("application/json", [json.dumps(CHAT_JSON).encode()])
        )
    if path.startswith("/v1/responses"):
        return (
            ("text/event-stream", RESPONSES_SSE)
            if stream
            else ("application/json", [json.dumps(RESPONSE_OBJ).encode()])
        )
    if path.startswith("/v1/messages"):
        return (
            ("text/event-stream", ANTHROPIC_SSE)
            if stream
            else ("application/json", [json.dumps(ANTHROPIC_JSON).encode()])
        )
    if path.startswith("/v1beta/models/"):
        return (
            ("text/event-stream", GEMINI_SSE)
            if stream
            else ("application/json", [json.dumps(GEMINI_JSON).encode()])
        )
    return "application/json", [b'{"error": {"message": "no such route"}}']


@dataclass
class Received:
    host: str
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class StandIn:
    """The HTTPS stand-in server (a thread). `delay` seconds pass between streamed chunks."""

    ca: TestCA
    delay: float = 0.002
    text_only: bool = False
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.ca.server_cert, self.ca.server_key)
        ctx.set_alpn_protocols(["http/1.1"])
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve(b"")

            def do_POST(self) -> None:
                self._serve(self.rfile.read(int(self.headers.get("content-length") or 0)))

            def _serve(self, raw: bytes) -> None:
                host = (self.headers.get("host") or "").split(":")[0]
                standin.received.append(Received(host, self.command, self.path, dict(self.headers), raw))
                fault = self.headers.get("x-standin", "")
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                ctype, chunks = canned(host, self.path, body, text_only=standin.text_only)
                status = 200
                if fault == "error":
                    status, ctype, chunks = 429, "application/json", [json.dumps(ERRORS[host]).encode()]
                elif fault == "notjson":
                    ctype, chunks = "text/html", [NOT_JSON]
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("x-request-id", "req-standin")
                if ctype == "text/event-stream":
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    cut = len(chunks) // 2 if fault == "drop" else len(chunks)
                    for i, chunk in enumerate(chunks[:cut]):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                        time.sleep(1.0 if fault == "slow" and i == 0 else standin.delay)
                    if fault == "drop":
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    data = b"".join(chunks)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket.socket, Any]:
                sock, addr = super().get_request()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as real servers do
                return ctx.wrap_socket(sock, server_side=True), addr

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def resolve_args(self) -> list[str]:
        """`--resolve` flags sending every stand-in host here."""
        hosts = (*PROVIDER_HOSTS, OTHER_HOST, CUSTOM_HOST)
        return [a for h in hosts for a in ("--resolve", f"{h}=127.0.0.1:{self.port}")]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def expected_body(host: str, path: str, body: dict[str, Any]) -> bytes:
    return b"".join(canned(host, path, body)[1])
