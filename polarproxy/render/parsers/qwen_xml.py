"""XML tool calls (Qwen3-Coder, Qwen3.5):
`<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>`.

The arguments are built as JSON text (`{"K": V, ...}`, in `json.dumps` style) and streamed as the
parameters are sampled. Each value is typed by the tool's JSON Schema (from the request's tools): a
`string` parameter, or one the schema does not describe, is kept raw and streams as it is sampled; an
`integer`, `number`, `boolean`, `null`, `object` or `array` parameter (or one whose schema names no type)
is parsed from its text once complete, and kept as a string when it does not parse. The newline the
template writes after `<parameter=K>` and before `</parameter>` is not part of the value.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from polarproxy.render.parsers.base import Machine, could_start, find_first, json_escape, partial_suffix

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
FUNCTION_CLOSE = "</function>"
PARAM_CLOSE = "</parameter>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>")
_FUNCTION_CLOSE = re.compile(r"\s*</function>")
_CALL_CLOSE = re.compile(r"\s*</tool_call>")
# A value ends at its closing tag; a model that forgets it ends the value at the next tag.
_VALUE_ENDS = tuple(
    pre + tag for tag in (PARAM_CLOSE, "<parameter=", FUNCTION_CLOSE, CALL_CLOSE) for pre in ("\n", "")
)
_MARKUP = ("<parameter=", FUNCTION_CLOSE, CALL_CLOSE)


def schema_types(schema: Any) -> list[str] | None:
    """The JSON types a parameter's schema allows; None when it names none (anyOf, no schema)."""
    if not isinstance(schema, dict) or "type" not in schema:
        return None
    t = schema["type"]
    return (
        [t] if isinstance(t, str) else [x for x in t if isinstance(x, str)] if isinstance(t, list) else None
    )


def is_raw_string(schema: Any) -> bool:
    """Whether the value is kept as sampled: a string parameter, or one the tool does not describe."""
    if schema is None:
        return True
    types = schema_types(schema)
    return types is not None and "string" in types


def convert(text: str, schema: Any) -> Any:
    """A parameter's text as the JSON value its schema asks for; the text itself when it is not one."""
    if is_raw_string(schema):
        return text
    value = text.strip()
    types = schema_types(schema)
    for t in types or ["json"]:
        if t == "integer":
            if re.fullmatch(r"-?\d+", value):
                return int(value)
        elif t == "number":
            if re.fullmatch(r"-?\d+", value):
                return int(value)
            try:
                f = float(value)
            except ValueError:
                continue
            if math.isfinite(f):
                return f
        elif t == "boolean":
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif t == "null":
            if value.lower() in ("null", "none"):
                return None
        elif t in ("object", "array", "json"):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if t == "json" or isinstance(parsed, dict if t == "object" else list):
                return parsed
    return text


class QwenXmlParser(Machine):
    def on_text(self) -> bool:
        if self.text_until((CALL_OPEN,)) is None:
            return False
        self.mode = "head"
        return True

    def on_head(self) -> bool:
        m = _FUNCTION.match(self.buf)
        if m:
            name = m.group(1).strip()
            self.out.open_call(name)
            self.out.args("{")
            self.raw = ""
            self.drop(m.end())
            self._tool = self.tools.get(name)
            self._params = 0
            self.mode = "params"
            return True
        head = self.buf.lstrip()
        if could_start(head, ("<function=",)) or (
            head.startswith("<function=") and not re.search(r"[>\n]", head)
        ):
            return False
        return self.as_text()

    def _param_schema(self, key: str) -> Any:
        if self._tool is None:
            return None
        props = self._tool.parameters.get("properties")
        return props.get(key) if isinstance(props, dict) else None

    def on_params(self) -> bool:
        m = _PARAM.match(self.buf)
        if m:
            key = m.group(1).strip()
            self._schema = self._param_schema(key)
            self._raw_value = is_raw_string(self._schema)
            sep = ", " if self._params else ""
            self.out.args(sep + json.dumps(key, ensure_ascii=False) + ": " + ('"' if self._raw_value else ""))
            self._params += 1
            self._value = ""
            self._value_started = False
            self.drop(m.end())
            self.mode = "value"
            return True
        for closer in (_FUNCTION_CLOSE, _CALL_CLOSE):
            if m := closer.match(self.buf):
                self.out.args("}")
                self.out.close_call()
                self.drop(m.end())
                self.mode = "after" if closer is _FUNCTION_CLOSE else "text"
                return True
        head = self.buf.lstrip()
        if could_start(head, _MARKUP) or (head.startswith("<parameter=") and not re.search(r"[>\n]", head)):
            return False
        nxt = self.buf.find("<", 1)  # something else between parameters: skipped
        self.drop(nxt if nxt > 0 else len(self.buf))
        return True

    def on_value(self) -> bool:
        if not self._value_started:
            if self.buf.startswith("\n"):
                self.drop(1)
            self._value_started = True
        i, tag = find_first(self.buf, _VALUE_ENDS)
        if i < 0:
            keep = partial_suffix(self.buf, _VALUE_ENDS)
            self._add_value(self.buf[: len(self.buf) - keep])
            self.drop(len(self.buf) - keep)
            return False
        self._add_value(self.buf[:i])
        self._end_value()
        self.drop(i + len(tag) if tag.endswith(PARAM_CLOSE) else i + tag.startswith("\n"))
        self.mode = "params"
        return True

    def _add_value(self, text: str) -> None:
        if self._raw_value:
            self.out.args(json_escape(text))
        else:
            self._value += text

    def _end_value(self) -> None:
        if self._raw_value:
            self.out.args('"')
        else:
            self.out.args(json.dumps(convert(self._value, self._schema), ensure_ascii=False))

    def on_after(self) -> bool:
        """After `</function>`: `</tool_call>`, else back to text."""
        m = _CALL_CLOSE.match(self.buf)
        if m:
            self.drop(m.end())
            self.mode = "text"
            return True
        if could_start(self.buf.lstrip(), (CALL_CLOSE,)):
            return False
        self.mode = "text"
        return True

    def finish_markup(self) -> None:
        if self.mode == "head":
            self.as_text()
            return
        if self.mode == "value":
            self._add_value(self.buf)
            self._end_value()
            self.mode = "params"
        if self.mode == "params":
            self.out.args("}")
            self.out.close_call()
        self.buf = ""  # what follows an unfinished call's parameters, or `</function>`, is markup
        self.mode = "text"
