import json

import orjson
import pytest

from polarproxy.conversation import Completion, ReasoningDelta, TextDelta, ToolCall, ToolCallEvent, Usage
from polarproxy.dialects import DialectError, route
from polarproxy.dialects.base import answer_signature
from polarproxy.dialects.gemini import Gemini, read_signature, wire_signature
from polarproxy.sse import KEEPALIVE, SSEDecoder

GEMINI = Gemini()
STREAM = "/v1beta/models/m:streamGenerateContent"
UNARY = "/v1beta/models/m:generateContent"


def parse(body, path=UNARY, query=None):
    return GEMINI.parse(body, path=path, query=query or {})


def user(text="hi"):
    return {"role": "user", "parts": [{"text": text}]}


@pytest.mark.parametrize("harness", ["gemini", "pi-google"])
def test_every_captured_gemini_request_parses(traffic, harness):
    for rec in traffic(harness):
        body, path = rec["body"], rec["path"]
        assert route(rec["method"], path) is not None and route(rec["method"], path).name == "gemini"
        conv = GEMINI.parse(body, path=path, query=rec["query"])
        assert conv.model == path.rsplit("/", 1)[1].split(":")[0]
        assert conv.stream == path.endswith(":streamGenerateContent")
        assert conv.sse == (rec["query"].get("alt") == "sse")
        assert conv.messages[0].role == "system"
        assert conv.messages[0].content == "\n\n".join(p["text"] for p in body["systemInstruction"]["parts"])
        decls = [d for t in body.get("tools", []) for d in t.get("functionDeclarations", [])]
        assert [t.name for t in conv.tools] == [d["name"] for d in decls]
        for d, tool in zip(decls, conv.tools, strict=True):
            assert tool.parameters == d["parametersJsonSchema"]  # used as is
            assert tool.description == d["description"]
        calls = [p["functionCall"] for c in body["contents"] for p in c["parts"] if "functionCall" in p]
        assert [json.loads(t.arguments) for m in conv.messages for t in m.tool_calls] == [
            c["args"] for c in calls
        ]
        responses = [m for m in conv.messages if m.role == "tool"]
        assert len(responses) == sum("functionResponse" in p for c in body["contents"] for p in c["parts"])
        ids = {t.id for m in conv.messages for t in m.tool_calls}
        assert all(m.tool_call_id in ids for m in responses)  # every response answers a call
        json.dumps(conv.to_dict())  # storable


def test_gemini_cli_router_call_with_a_json_schema_is_an_ordinary_non_streamed_call(traffic):
    rec = traffic("gemini")[0]
    assert "responseJsonSchema" in rec["body"]["generationConfig"]
    conv = GEMINI.parse(rec["body"], path=rec["path"], query=rec["query"])
    assert conv.model == "gemini-3.5-flash-lite" and not conv.stream
    assert conv.messages[0].content.startswith("\nYou are a specialized Task Routing AI.")
    assert [m.role for m in conv.messages] == ["system", "user", "user"]  # two user contents, kept apart
    assert conv.messages[2].content == "List the files in the current directory, then say done."
    assert conv.tools == []
    s = conv.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens) == (1.0, 0.95, 64, None)


def test_gemini_cli_tool_turn_keeps_call_id_signature_and_pairs_the_response(traffic):
    rec = traffic("gemini")[2]
    conv = GEMINI.parse(rec["body"], path=rec["path"], query=rec["query"])
    assert conv.model == "gemini-3.8-flash" and conv.stream and conv.sse
    first_user = conv.messages[1]
    parts = rec["body"]["contents"][0]["parts"]
    assert first_user.content == parts[0]["text"] + "\n\n" + parts[1]["text"]
    assistant, tool = conv.messages[2], conv.messages[3]
    assert assistant.role == "assistant" and assistant.content == "" and assistant.reasoning is None
    assert assistant.signature == "RkFLRV9USE9VR0hUX1NJRw=="  # someone else's signature: kept as sent
    (call,) = assistant.tool_calls
    assert call.id == "run_shell_command_1795969774509_0"
    assert call.name == "run_shell_command" and call.arguments == '{"command": "ls"}'
    assert tool.role == "tool" and tool.tool_call_id == call.id and tool.name == "run_shell_command"
    assert tool.content.startswith("<untrusted_context>\nOutput: README.md")  # the `output` string itself
    run_shell = next(t for t in conv.tools if t.name == "run_shell_command")
    assert run_shell.parameters["properties"]["command"]["type"] == "string"


def test_pi_google_thought_part_generated_call_id_and_pairing_by_name(traffic):
    rec = traffic("pi-google")[1]
    conv = GEMINI.parse(rec["body"], path=rec["path"], query=rec["query"])
    assert conv.model == "fake-gemini" and conv.sampling.max_tokens == 8192
    assistant, tool = conv.messages[2], conv.messages[3]
    assert assistant.reasoning == "**Planning** Thinking about the request."
    assert assistant.content == ""
    assert assistant.tool_calls[0].id == "call_1_0"  # no id on the wire: from its position, stable
    assert assistant.signature == "RkFLRV9USE9VR0hUX1NJRw=="
    assert tool.tool_call_id == "call_1_0" and tool.content == "README.md\nhello.py\n"


def test_our_signature_round_trips_through_base64():
    sig = answer_signature("abc123")
    wire = wire_signature(sig)
    assert read_signature(wire) == sig
    assert read_signature("not base64!") == "not base64!"
    body = {
        "contents": [
            user(),
            {
                "role": "model",
                "parts": [{"text": "t", "thought": True}, {"text": "a", "thoughtSignature": wire}],
            },
            user("more"),
        ]
    }
    assert parse(body).messages[1].signature == sig


@pytest.mark.parametrize(
    "path, ok",
    [
        ("/v1beta/models/gemini-2.5-pro:generateContent", True),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", True),
        ("/v1/models/x:generateContent", True),
        ("/proxy/v1beta/models/x%3AstreamGenerateContent", True),
        ("/v1beta/models/x:countTokens", False),
        ("/v1beta/models/:generateContent", False),
        ("/v1/chat/completions", False),
        ("/v1/messages", False),
    ],
)
def test_matches_model_method_paths(path, ok):
    assert GEMINI.matches("POST", path) is ok
    assert not GEMINI.matches("GET", path)
    found = route("POST", path)
    assert (found is not None and found.name == "gemini") is ok


def test_alt_sse_and_method_decide_framing():
    assert not parse({"contents": [user()]}).stream
    conv = parse({"contents": [user()]}, path=STREAM, query={"alt": "sse"})
    assert conv.stream and conv.sse
    conv = parse({"contents": [user()]}, path=STREAM)
    assert conv.stream and not conv.sse
    assert (
        GEMINI.stream_writer(conv, response_id="r", model="m", created=0).content_type == "application/json"
    )


def test_tools_schema_kinds_tool_config_and_generation_config():
    body = {
        "contents": [user()],
        "tools": [
            {"googleSearch": {}},
            {"codeExecution": {}},
            {
                "functionDeclarations": [
                    {
                        "name": "f",
                        "description": "d",
                        "parameters": {
                            "type": "OBJECT",
                            "properties": {"a": {"type": "ARRAY", "items": {"type": "STRING"}}},
                        },
                    },
                    {"name": "g"},
                ]
            },
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {
            "temperature": 0,
            "topP": 0.5,
            "topK": 3,
            "maxOutputTokens": 10,
            "stopSequences": ["END"],
            "seed": 7,
            "candidateCount": 1,
            "thinkingConfig": {"thinkingBudget": 0},
            "responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT"},
        },
    }
    conv = parse(body)
    assert [t.name for t in conv.tools] == ["f", "g"]
    assert conv.tools[0].parameters == {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "string"}}},
    }
    assert conv.tools[1].parameters == {}
    assert conv.tool_choice == {"type": "function", "function": {"name": "f"}}
    s = conv.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.stop, s.seed) == (0.0, 0.5, 3, 10, ["END"], 7)
    for mode, want in [("AUTO", "auto"), ("NONE", "none"), ("ANY", "required"), ("VALIDATED", "auto")]:
        body["toolConfig"] = {"functionCallingConfig": {"mode": mode}}
        assert parse(body).tool_choice == want


def test_function_response_content_and_pairing_rules():
    body = {
        "contents": [
            user(),
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "a", "args": {"x": "é"}}},
                    {"functionCall": {"name": "b", "args": {}}},
                    {"functionCall": {"name": "a", "args": {}, "id": "given"}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "b", "response": {"output": "B"}}},
                    {"functionResponse": {"name": "a", "response": {"error": "boom"}}},
                    {"functionResponse": {"name": "a", "id": "given", "response": {"content": "C"}}},
                    {"text": "and then"},
                ],
            },
        ]
    }
    msgs = parse(body).messages
    assert [t.id for t in msgs[1].tool_calls] == ["call_1_0", "call_1_1", "given"]
    assert msgs[1].tool_calls[0].arguments == '{"x": "é"}'  # ensure_ascii=False
    assert [(m.role, m.tool_call_id, m.content) for m in msgs[2:]] == [
        ("tool", "call_1_1", "B"),
        ("tool", "call_1_0", '{"error": "boom"}'),
        ("tool", "given", "C"),
        ("user", None, "and then"),
    ]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ([], "JSON object"),
        ({}, "contents must be a non-empty array"),
        ({"contents": []}, "contents must be a non-empty array"),
        ({"contents": [{"role": "wizard", "parts": [{"text": "x"}]}]}, "Unknown role 'wizard'"),
        ({"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}]}, "'inlineData'"),
        ({"contents": [{"parts": [{"fileData": {"fileUri": "gs://x"}}]}]}, "'fileData'"),
        ({"contents": [{"parts": [{"text": 3}]}]}, "parts[0].text must be a string"),
        ({"contents": [{"parts": [{"weird": 1}]}]}, "'weird'"),
        ({"contents": [{"parts": "x"}]}, "parts must be an array"),
        ({"contents": [{"parts": [{"functionCall": {"name": "f"}}]}]}, "functionCall in a 'user' turn"),
        (
            {"contents": [{"role": "model", "parts": [{"functionResponse": {"name": "f"}}]}]},
            "functionResponse in a 'model' turn",
        ),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, "needs a name"),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]},
            "args must be an object",
        ),
        ({"contents": [user()], "generationConfig": {"candidateCount": 2}}, "candidateCount=2"),
        ({"contents": [user()], "generationConfig": {"temperature": "hot"}}, "temperature must be a number"),
        ({"contents": [user()], "generationConfig": {"stopSequences": "x"}}, "stopSequences"),
        ({"contents": [user()], "tools": [{"functionDeclarations": [{}]}]}, "needs a name"),
        ({"contents": [user()], "cachedContent": "cachedContents/1"}, "cachedContent"),
    ],
)
def test_bad_requests_name_the_bad_value(body, fragment):
    with pytest.raises(DialectError) as e:
        parse(body)
    assert fragment in e.value.message
    assert e.value.status == 400


def test_error_bodies_are_google_shaped():
    for status, name in [
        (400, "INVALID_ARGUMENT"),
        (404, "NOT_FOUND"),
        (503, "UNAVAILABLE"),
        (500, "INTERNAL"),
    ]:
        err = orjson.loads(GEMINI.error(status, "msg", "some_code"))["error"]
        assert (err["code"], err["message"], err["status"]) == (status, "msg", name)
        assert err["details"][0]["reason"] == "some_code"


# -- answers ----------------------------------------------------------------------------------------


def completion(**kw):
    c = Completion(
        text="Done.",
        reasoning="thought",
        tool_calls=[ToolCall(id="call_1", name="ls", arguments='{"path": "."}')],
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        signature=answer_signature("r1"),
    )
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def validate(obj):
    from google.genai import types

    return types.GenerateContentResponse.model_validate(obj)


def test_non_streamed_response_validates_with_the_sdk():
    body = orjson.loads(GEMINI.response(completion(), response_id="r1", model="m", created=1))
    assert body["responseId"] == "r1" and body["modelVersion"] == "m"
    cand = body["candidates"][0]
    assert cand["finishReason"] == "STOP" and cand["index"] == 0
    assert cand["content"]["parts"] == [
        {"text": "thought", "thought": True},
        {
            "text": "Done.",
            "thoughtSignature": wire_signature(answer_signature("r1")),
        },  # first non-thought part
        {"functionCall": {"name": "ls", "args": {"path": "."}, "id": "call_1"}},
    ]
    assert body["usageMetadata"] == {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
    r = validate(body)
    assert r.text == "Done."
    assert r.function_calls[0].name == "ls" and r.function_calls[0].args == {"path": "."}
    assert r.candidates[0].content.parts[1].thought_signature == b"polarproxy:r1"
    assert r.usage_metadata.total_token_count == 15


def test_signature_placement_without_text_and_finish_reasons():
    parts = GEMINI.parts(completion(text="", tool_calls=[]))
    assert parts == [
        {"text": "thought", "thought": True},
        {"text": "", "thoughtSignature": parts[1]["thoughtSignature"]},
    ]
    parts = GEMINI.parts(completion(text="", reasoning=None))
    assert "thoughtSignature" in parts[0] and "functionCall" in parts[0]
    body = orjson.loads(
        GEMINI.response(completion(finish_reason="length"), response_id="r", model="m", created=1)
    )
    assert body["candidates"][0]["finishReason"] == "MAX_TOKENS"
    validate(body)
    # arguments that are not a JSON object still make a valid functionCall
    c = completion(tool_calls=[ToolCall(id="c", name="f", arguments="not json")])
    assert GEMINI.parts(c)[-1]["functionCall"]["args"] == {"arguments": "not json"}


def stream_bytes(sse=True, c=None):
    c = c or completion()
    conv = parse({"contents": [user()]}, path=STREAM, query={"alt": "sse"} if sse else {})
    w = GEMINI.stream_writer(conv, response_id="r1", model="m", created=1)
    chunks = [
        w.start(),
        w.events([ReasoningDelta("thou"), ReasoningDelta("ght")]),
        w.keepalive(),
        w.events([TextDelta("Do"), TextDelta("ne")]),
        w.events([]),
        w.events([TextDelta("."), ToolCallEvent(0, c.tool_calls[0])]),
        w.finish(c),
    ]
    return w, b"".join(chunks)


def test_stream_chunks_validate_and_add_up_to_the_non_streamed_answer():
    w, raw = stream_bytes()
    assert w.content_type == "text/event-stream"
    assert w.keepalive() == KEEPALIVE
    events = SSEDecoder().decode(raw)
    objs = [json.loads(e.data) for e in events]
    responses = [validate(o) for o in objs]
    assert all(o["responseId"] == "r1" and o["modelVersion"] == "m" for o in objs)
    assert "finishReason" not in objs[0]["candidates"][0] and "usageMetadata" not in objs[0]
    assert objs[-1]["candidates"][0]["finishReason"] == "STOP"
    assert objs[-1]["usageMetadata"]["totalTokenCount"] == 15
    parts = [p for o in objs for p in o["candidates"][0]["content"]["parts"]]
    text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
    thought = "".join(p["text"] for p in parts if p.get("thought"))
    unary = validate(orjson.loads(GEMINI.response(completion(), response_id="r1", model="m", created=1)))
    assert text == unary.text == "Done."
    assert thought == "thought"
    assert [fc.args for r in responses for fc in (r.function_calls or [])] == [{"path": "."}]
    signed = [p for p in parts if "thoughtSignature" in p]
    assert len(signed) == 1 and signed[0]["text"] == "Done"  # the first non-thought part (deltas merged)
    assert read_signature(signed[0]["thoughtSignature"]) == answer_signature("r1")


def test_stream_with_only_reasoning_signs_the_last_chunk():
    c = completion(text="", tool_calls=[])
    conv = parse({"contents": [user()]}, path=STREAM, query={"alt": "sse"})
    w = GEMINI.stream_writer(conv, response_id="r1", model="m", created=1)
    raw = w.start() + w.events([ReasoningDelta("thought")]) + w.finish(c)
    objs = [json.loads(e.data) for e in SSEDecoder().decode(raw)]
    last = objs[-1]["candidates"][0]["content"]["parts"]
    assert last == [{"text": "", "thoughtSignature": wire_signature(answer_signature("r1"))}]


def test_sse_split_at_every_byte_offset_gives_the_same_events():
    _, raw = stream_bytes()
    whole = SSEDecoder().decode(raw)
    for cut in range(len(raw) + 1):
        d = SSEDecoder()
        assert d.decode(raw[:cut]) + d.decode(raw[cut:]) + d.flush() == whole


def test_json_array_stream_is_one_json_array_of_valid_responses():
    w, raw = stream_bytes(sse=False)
    assert w.content_type == "application/json"
    assert w.keepalive() == b"\n"  # JSON whitespace; never b"" (that would end a chunked body)
    objs = json.loads(raw)
    assert isinstance(objs, list) and len(objs) == 4
    for o in objs:
        validate(o)
    assert objs[-1]["candidates"][0]["finishReason"] == "STOP"


def test_stream_errors_end_the_stream_in_either_framing():
    conv = parse({"contents": [user()]}, path=STREAM)
    w = GEMINI.stream_writer(conv, response_id="r", model="m", created=1)
    raw = w.start() + w.events([TextDelta("a")]) + w.error("backend died", "backend_error")
    arr = json.loads(raw)
    assert arr[-1]["error"] == {
        "code": 500,
        "message": "backend died",
        "status": "INTERNAL",
        "details": arr[-1]["error"]["details"],
    }
    w = GEMINI.stream_writer(conv, response_id="r", model="m", created=1)
    assert json.loads(w.start() + w.error("x", "y"))[0]["error"]["status"] == "INTERNAL"
    conv = parse({"contents": [user()]}, path=STREAM, query={"alt": "sse"})
    w = GEMINI.stream_writer(conv, response_id="r", model="m", created=1)
    (ev,) = SSEDecoder().decode(w.error("x", "y"))
    assert json.loads(ev.data)["error"]["status"] == "INTERNAL"
