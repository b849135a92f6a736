"""Google Gemini: `POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent`.

The model is named in the path, not the body, and the method name decides streaming. A streamed answer is
SSE with `?alt=sse` (what the SDKs and Gemini CLI ask for); without it Google streams one JSON array whose
elements are `GenerateContentResponse` objects, and so do we.

Decisions (text-only backend, one candidate):

- Text parts: a model turn's text parts are concatenated as they are (a streamed answer comes back split at
  arbitrary points); the text parts of a user turn or of `systemInstruction` are separate blocks and are
  joined with a blank line. `thought: true` parts of a model turn are its reasoning.
- `thoughtSignature` on any part of a model turn becomes `Message.signature` (the first one found). We put
  ours (`Completion.signature`) on the first part that is not a thought: Gemini CLI drops thought parts from
  its history and keeps the signature only where it sits on a text or functionCall part. An answer with no
  such part carries it on an empty text part. On the wire a signature is bytes, i.e. base64 (the SDKs
  refuse anything else), so ours goes out base64-encoded and is decoded back to `polarproxy:...` on parse;
  anyone else's is kept exactly as sent.
- `functionCall` without an `id` gets `call_{content index}_{call index}`, the same every time the history
  is sent again. A `functionResponse` answers the call with its `id`, else the earliest unanswered call of
  the latest model turn with the same name, else the earliest unanswered one. Its content is the response's
  `output` (or `content`) when that is the response's only field and a string, else the response as JSON.
- `inlineData`, `fileData`, `executableCode`, `codeExecutionResult` and `cachedContent` are refused (400).
  Tools other than `functionDeclarations` (googleSearch, codeExecution, urlContext...) are left out of the
  prompt. `parametersJsonSchema` is used as is; a `parameters` Schema has its upper-case types lower-cased.
- `generationConfig`: temperature, topP, topK, maxOutputTokens, stopSequences, seed are honoured;
  candidateCount must be 1; thinkingConfig and responseMimeType / responseSchema / responseJsonSchema are
  accepted and ignored (no constrained decoding: the schema is not enforced, the model just answers).
- Streams: each chunk holds only the new parts; the last carries finishReason and usageMetadata. A
  JSON-array stream keeps itself alive with a newline between elements (JSON whitespace): an empty
  keep-alive would be written as an empty HTTP chunk, which ends a chunked body.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson

from polarproxy.conversation import (
    Completion,
    Conversation,
    Message,
    ReasoningDelta,
    Sampling,
    StreamEvent,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallEvent,
)
from polarproxy.dialects.base import DialectError, answer_signature, max_tokens, sampling_number, string
from polarproxy.sse import KEEPALIVE, encode

METHODS = ("generateContent", "streamGenerateContent")
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
UNSUPPORTED_PARTS = ("inlineData", "fileData", "executableCode", "codeExecutionResult")
KNOWN_PART_KEYS = frozenset(
    {
        "text",
        "thought",
        "thoughtSignature",
        "functionCall",
        "functionResponse",
        "partMetadata",
        "videoMetadata",
    }
)


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL")


def wire_signature(signature: str) -> str:
    """A neutral signature as a `thoughtSignature` (bytes, so base64 in JSON: the SDKs decode it)."""
    return base64.b64encode(signature.encode()).decode()


def read_signature(raw: str) -> str:
    """A `thoughtSignature` in neutral form: ours decoded back to `polarproxy:...`, any other kept as sent."""
    try:
        text = base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, ValueError):
        return raw
    return text if text.startswith(answer_signature("")) else raw


def split_path(path: str) -> tuple[str, str] | None:
    """(model, method) from `.../models/{model}:{method}`, or None when the path is not one of ours."""
    last = unquote(path.rstrip("/").rpartition("/")[2])
    model, sep, method = last.rpartition(":")
    if not sep or not model or method not in METHODS:
        return None
    return model, method


@dataclass(slots=True)
class GeminiConversation(Conversation):
    """A Conversation that also remembers how a streamed answer is framed: `?alt=sse`, else a JSON array."""

    sse: bool = True


# -- parsing ----------------------------------------------------------------------------------------


def _parts(raw: Any, where: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise DialectError(f"{where}.parts must be an array.")
    for j, part in enumerate(raw):
        if not isinstance(part, dict):
            raise DialectError(f"{where}.parts[{j}] must be an object.")
        for key in UNSUPPORTED_PARTS:
            if key in part:
                raise DialectError(
                    f"Unsupported part {key!r} at {where}.parts[{j}]. Supported: text, functionCall, "
                    "functionResponse. This model takes text only."
                )
        unknown = [k for k in part if k not in KNOWN_PART_KEYS]
        if unknown:
            raise DialectError(
                f"Unknown part field {unknown[0]!r} at {where}.parts[{j}]. Supported: text, thought, "
                "thoughtSignature, functionCall, functionResponse."
            )
        if "text" in part and not isinstance(part["text"], str):
            raise DialectError(f"{where}.parts[{j}].text must be a string.")
    return raw


def _system(raw: Any) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, dict):
        raise DialectError("systemInstruction must be a Content object with parts.")
    parts = _parts(raw.get("parts"), "systemInstruction")
    return "\n\n".join(p["text"] for p in parts if "text" in p)


def _call(raw: Any, where: str, call_id: str) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise DialectError(f"{where}.functionCall needs a name.")
    args = raw.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise DialectError(f"{where}.functionCall.args must be an object.")
    rid = raw.get("id")
    return ToolCall(
        id=rid if isinstance(rid, str) and rid else call_id,
        name=raw["name"],
        arguments=json.dumps(args, ensure_ascii=False),
    )


def _response_text(response: Any) -> str:
    """A functionResponse's `response` as the tool message's content (see the module docstring)."""
    if isinstance(response, dict) and len(response) == 1:
        (key, value), *_ = response.items()
        if key in ("output", "content") and isinstance(value, str):
            return value
    return json.dumps(response, ensure_ascii=False)


def _model_message(parts: list[dict[str, Any]], i: int) -> tuple[Message, list[ToolCall]]:
    where = f"contents[{i}]"
    text: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    signature = None
    for j, part in enumerate(parts):
        if signature is None and isinstance(part.get("thoughtSignature"), str):
            signature = read_signature(part["thoughtSignature"])
        if "functionResponse" in part:
            raise DialectError(
                f"{where}.parts[{j}] is a functionResponse in a 'model' turn; it belongs in a 'user' turn."
            )
        if "functionCall" in part:
            calls.append(_call(part["functionCall"], f"{where}.parts[{j}]", f"call_{i}_{len(calls)}"))
        elif "text" in part:
            (thoughts if part.get("thought") else text).append(part["text"])
    msg = Message(
        role="assistant",
        content="".join(text),
        reasoning="".join(thoughts) if thoughts else None,
        tool_calls=calls,
        signature=signature,
    )
    return msg, list(calls)


def _user_messages(parts: list[dict[str, Any]], i: int, pending: list[ToolCall]) -> list[Message]:
    """A user turn in part order: runs of text become user messages, each functionResponse a tool message."""
    where = f"contents[{i}]"
    out: list[Message] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            out.append(Message(role="user", content="\n\n".join(text)))
            text.clear()

    for j, part in enumerate(parts):
        if "functionCall" in part:
            raise DialectError(
                f"{where}.parts[{j}] is a functionCall in a 'user' turn; it belongs in a 'model' turn."
            )
        if "functionResponse" in part:
            flush()
            fr = part["functionResponse"]
            if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                raise DialectError(f"{where}.parts[{j}].functionResponse needs a name.")
            out.append(
                Message(
                    role="tool",
                    content=_response_text(fr.get("response", {})),
                    tool_call_id=_answered(fr, pending),
                    name=fr["name"],
                )
            )
        elif "text" in part:
            text.append(part["text"])
    flush()
    return out


def _answered(fr: dict[str, Any], pending: list[ToolCall]) -> str | None:
    """The ID of the call this functionResponse answers (removed from `pending`)."""
    rid = fr.get("id")
    if isinstance(rid, str) and rid:
        for k, call in enumerate(pending):
            if call.id == rid:
                del pending[k]
                break
        return rid
    for k, call in enumerate(pending):
        if call.name == fr["name"]:
            return pending.pop(k).id
    return pending.pop(0).id if pending else None


def _messages(body: dict[str, Any]) -> list[Message]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise DialectError("contents must be a non-empty array.")
    messages: list[Message] = []
    system = _system(body.get("systemInstruction", body.get("system_instruction")))
    if system:
        messages.append(Message(role="system", content=system))
    pending: list[ToolCall] = []
    for i, content in enumerate(contents):
        if not isinstance(content, dict):
            raise DialectError(f"contents[{i}] must be an object.")
        role = content.get("role") or "user"
        parts = _parts(content.get("parts"), f"contents[{i}]")
        if role == "model":
            msg, pending = _model_message(parts, i)
            messages.append(msg)
        elif role in ("user", "function"):
            messages.extend(_user_messages(parts, i, pending))
        else:
            raise DialectError(f"Unknown role {role!r} at contents[{i}]. Must be 'user' or 'model'.")
    return messages


def _schema(s: Any) -> Any:
    """A Gemini `Schema` as JSON Schema: its upper-case type names lower-cased, recursively."""
    if isinstance(s, list):
        return [_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k == "type" and isinstance(v, str):
            out[k] = v.lower()
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: _schema(p) for name, p in v.items()}
        elif k in ("items", "anyOf"):
            out[k] = _schema(v)
        else:
            out[k] = v
    return out


def _tools(raw: Any) -> list[Tool]:
    if not raw:
        return []
    if not isinstance(raw, list):
        raise DialectError("tools must be an array.")
    tools = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise DialectError(f"tools[{i}] must be an object.")
        decls = t.get("functionDeclarations", t.get("function_declarations"))
        if decls is None:
            continue  # googleSearch, codeExecution, urlContext...: nothing the model can be prompted with
        if not isinstance(decls, list):
            raise DialectError(f"tools[{i}].functionDeclarations must be an array.")
        for j, d in enumerate(decls):
            if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"]:
                raise DialectError(f"tools[{i}].functionDeclarations[{j}] needs a name.")
            params = d.get("parametersJsonSchema")
            if params is None:
                params = _schema(d.get("parameters") or {})
            if not isinstance(params, dict):
                raise DialectError(f"tools[{i}].functionDeclarations[{j}] parameters must be an object.")
            where = f"tools[{i}].functionDeclarations[{j}]."
            tools.append(
                Tool(name=d["name"], description=string(d, "description", where=where), parameters=params)
            )
    return tools


def _tool_choice(raw: Any) -> str | dict[str, Any] | None:
    """`toolConfig.functionCallingConfig` in the neutral (Chat Completions) spelling."""
    if not isinstance(raw, dict):
        return None
    fcc = raw.get("functionCallingConfig")
    if not isinstance(fcc, dict):
        return None
    mode = str(fcc.get("mode") or "AUTO").upper()
    names = [n for n in fcc.get("allowedFunctionNames") or [] if isinstance(n, str)]
    if mode == "NONE":
        return "none"
    if mode != "ANY":
        return "auto"
    if len(names) == 1:
        return {"type": "function", "function": {"name": names[0]}}
    if names:
        tools = [{"type": "function", "function": {"name": n}} for n in names]
        return {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": tools}}
    return "required"


def _sampling(raw: Any) -> Sampling:
    if raw is None:
        return Sampling()
    if not isinstance(raw, dict):
        raise DialectError("generationConfig must be an object.")
    n = raw.get("candidateCount")
    if n not in (None, 1) or isinstance(n, bool):
        raise DialectError(
            f"generationConfig.candidateCount={n!r} is not supported. Must be 1; send one request per sample."
        )
    stop = raw.get("stopSequences")
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise DialectError("generationConfig.stopSequences must be an array of strings.")
    return Sampling(
        max_tokens=max_tokens(raw, "maxOutputTokens", where="generationConfig."),
        temperature=sampling_number(raw, "temperature", "temperature", where="generationConfig."),
        top_p=sampling_number(raw, "topP", "top_p", where="generationConfig."),
        top_k=sampling_number(raw, "topK", "top_k", where="generationConfig."),
        stop=list(stop or []),
        seed=sampling_number(raw, "seed", "seed", where="generationConfig."),
    )


# -- answering --------------------------------------------------------------------------------------


def _args(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as the object Gemini sends; text that is not one is wrapped."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _call_part(call: ToolCall) -> dict[str, Any]:
    return {"functionCall": {"name": call.name, "args": _args(call.arguments), "id": call.id}}


def _finish(c: Completion) -> str:
    return "MAX_TOKENS" if c.finish_reason == "length" else "STOP"


def _usage(c: Completion) -> dict[str, int]:
    return {
        "promptTokenCount": c.usage.prompt_tokens,
        "candidatesTokenCount": c.usage.completion_tokens,
        "totalTokenCount": c.usage.total_tokens,
    }


def _sign(parts: list[dict[str, Any]], signature: str | None) -> bool:
    """Put `signature` on the first part that is not a thought; whether there was one."""
    for part in parts:
        if not part.get("thought"):
            if signature is not None:
                part["thoughtSignature"] = signature
            return True
    return False


def error_object(status: int, message: str, code: str) -> dict[str, Any]:
    return {
        "code": status,
        "message": message,
        "status": status_name(status),
        "details": [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code, "domain": "polarproxy"}
        ],
    }


class Gemini:
    name = "gemini"
    routes = (
        "POST /v1beta/models/{model}:generateContent",
        "POST /v1beta/models/{model}:streamGenerateContent",
    )

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and split_path(path) is not None

    def parse(self, body: Any, *, path: str = "", query: dict[str, str] | None = None) -> Conversation:
        where = split_path(path)
        if where is None:
            raise DialectError(
                f"The path {path!r} names no model and method; expected /v1beta/models/MODEL:generateContent "
                "or :streamGenerateContent.",
                status=404,
                code="not_found",
            )
        model, method = where
        if not isinstance(body, dict):
            raise DialectError("The request body must be a JSON object (a GenerateContentRequest).")
        if body.get("cachedContent"):
            raise DialectError("cachedContent is not supported: send the whole conversation in contents.")
        return GeminiConversation(
            messages=_messages(body),
            tools=_tools(body.get("tools")),
            sampling=_sampling(body.get("generationConfig", body.get("generation_config"))),
            model=model,
            stream=method == "streamGenerateContent",
            include_usage=True,  # Gemini always reports usageMetadata
            tool_choice=_tool_choice(body.get("toolConfig")),
            sse=(query or {}).get("alt") == "sse",
        )

    def parts(self, completion: Completion) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        if completion.reasoning is not None:
            parts.append({"text": completion.reasoning, "thought": True})
        if completion.text:
            parts.append({"text": completion.text})
        parts.extend(_call_part(t) for t in completion.tool_calls)
        signature = wire_signature(completion.signature) if completion.signature is not None else None
        if not _sign(parts, signature):
            parts.append({"text": ""})
            _sign(parts, signature)
        return parts

    def response(self, completion: Completion, *, response_id: str, model: str, created: int) -> bytes:
        return orjson.dumps(
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": self.parts(completion)},
                        "finishReason": _finish(completion),
                        "index": 0,
                    }
                ],
                "usageMetadata": _usage(completion),
                "modelVersion": model,
                "responseId": response_id,
            }
        )

    def stream_writer(
        self, conv: Conversation, *, response_id: str, model: str, created: int, prompt_tokens: int = 0
    ) -> GeminiStreamWriter:
        return GeminiStreamWriter(response_id=response_id, model=model, sse=getattr(conv, "sse", True))

    def error(self, status: int, message: str, code: str) -> bytes:
        return orjson.dumps({"error": error_object(status, message, code)})


class GeminiStreamWriter:
    """SSE `data:` chunks (`?alt=sse`), or the elements of one JSON array."""

    def __init__(self, *, response_id: str, model: str, sse: bool = True) -> None:
        self.sse = sse
        self.content_type = "text/event-stream" if sse else "application/json"
        self._signature = wire_signature(answer_signature(response_id))
        self._signed = False
        self._tail = {"modelVersion": model, "responseId": response_id}
        self._n = 0  # JSON-array elements written

    def _emit(self, obj: dict[str, Any]) -> bytes:
        data = orjson.dumps(obj)
        if self.sse:
            return encode(data)
        sep = b"\n," if self._n else b""
        self._n += 1
        return sep + data

    def _chunk(self, parts: list[dict[str, Any]], completion: Completion | None = None) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        obj: dict[str, Any] = {"candidates": [candidate]}
        if completion is not None:
            candidate["finishReason"] = _finish(completion)
            obj["usageMetadata"] = _usage(completion)
        return self._emit({**obj, **self._tail})

    def start(self) -> bytes:
        return b"" if self.sse else b"["

    def events(self, events: list[StreamEvent]) -> bytes:
        parts: list[dict[str, Any]] = []
        for ev in events:
            last = parts[-1] if parts else None
            if isinstance(ev, TextDelta):
                if last is not None and "text" in last and not last.get("thought"):
                    last["text"] += ev.text
                else:
                    parts.append({"text": ev.text})
            elif isinstance(ev, ReasoningDelta):
                if last is not None and last.get("thought"):
                    last["text"] += ev.text
                else:
                    parts.append({"text": ev.text, "thought": True})
            elif isinstance(ev, ToolCallEvent):
                parts.append(_call_part(ev.call))
        if not parts:
            return b""
        if not self._signed:
            self._signed = _sign(parts, self._signature)
        return self._chunk(parts)

    def finish(self, completion: Completion) -> bytes:
        part: dict[str, Any] = {"text": ""}
        if not self._signed:
            sig = completion.signature
            part["thoughtSignature"] = wire_signature(sig) if sig is not None else self._signature
            self._signed = True
        out = self._chunk([part], completion)
        return out if self.sse else out + b"]"

    def error(self, message: str, code: str) -> bytes:
        out = self._emit({"error": error_object(500, message, code)})
        return out if self.sse else out + b"]"

    def keepalive(self) -> bytes:
        # JSON whitespace between array elements: b"" would go out as an empty chunk, ending the body.
        return KEEPALIVE if self.sse else b"\n"
