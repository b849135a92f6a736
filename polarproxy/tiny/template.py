"""The tiny model's chat template: a Qwen3-style format, written for polarproxy.

Output format (the proxy's renderer and output parser depend on it):

- system: ``<|im_start|>system\\n{system}<|im_end|>\\n``; with tools the system turn holds the system text
  (if any) then ``\\n\\n# Tools ...`` with one ``tojson`` line per tool inside ``<tools></tools>``.
- user: ``<|im_start|>user\\n{content}<|im_end|>\\n``.
- assistant: ``<|im_start|>assistant\\n`` + (``<think>\\n{reasoning}\\n</think>\\n\\n`` when the message has a
  ``reasoning_content`` string and comes after the last user message) + content + one
  ``\\n<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` per tool call (no leading ``\\n`` on the
  first when the content is empty) + ``<|im_end|>\\n``. Arguments given as a string are copied verbatim.
- consecutive tool messages: one user turn of ``\\n<tool_response>\\n{content}\\n</tool_response>`` blocks.
- ``add_generation_prompt``: ``<|im_start|>assistant\\n``, plus ``<think>\\n\\n</think>\\n\\n`` when
  ``enable_thinking`` is false.

An assistant message with ``reasoning_content=""`` renders ``<think>\\n\\n</think>\\n\\n`` + content, which
is exactly what a prompt built with ``enable_thinking=false`` followed by that content looks like.
Content may be a string, null, or a list of ``{"type": "text", "text": ...}`` parts.
"""

from __future__ import annotations

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


def _jinja_literal(text: str) -> str:
    """A single-quoted Jinja string literal for `text`."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


CHAT_TEMPLATE = (
    """{#- polarproxy tiny chat template (Qwen3-style). -#}
{%- macro render_text(c) -%}
    {%- if c is string -%}
        {{- c -}}
    {%- elif c is iterable and c is not mapping -%}
        {%- for part in c -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if has_system -%}
        {{- render_text(messages[0].content) + '\\n\\n' -}}
    {%- endif -%}
    {{- """
    + _jinja_literal(TOOLS_PREAMBLE)
    + """ -}}
    {%- for tool in tools -%}
        {{- '\\n' -}}
        {%- if tool.function is defined -%}
            {{- tool | tojson -}}
        {%- else -%}
            {{- {'type': 'function', 'function': tool} | tojson -}}
        {%- endif -%}
    {%- endfor -%}
    {{- """
    + _jinja_literal(TOOLS_POSTAMBLE)
    + """ + '<|im_end|>\\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\\n' + render_text(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {%- if not loop.first -%}
            {{- '<|im_start|>system\\n' + render_text(m.content) + '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- elif m.role == 'assistant' -%}
        {{- '<|im_start|>assistant\\n' -}}
        {%- if loop.index0 > ns.last_user and m.reasoning_content is string -%}
            {{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' -}}
        {%- endif -%}
        {%- set content = render_text(m.content) -%}
        {{- content -}}
        {%- if m.tool_calls -%}
            {%- for tc in m.tool_calls -%}
                {%- set f = tc.function if tc.function is defined else tc -%}
                {%- if not (loop.first and content == '') -%}
                    {{- '\\n' -}}
                {%- endif -%}
                {{- '<tool_call>\\n{"name": ' + (f.name | tojson) + ', "arguments": ' -}}
                {%- if f.arguments is string -%}
                    {{- f.arguments -}}
                {%- else -%}
                    {{- f.arguments | tojson -}}
                {%- endif -%}
                {{- '}\\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\\n<tool_response>\\n' + render_text(m.content) + '\\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + m.role + '\\n' + render_text(m.content) + '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\\n\\n</think>\\n\\n' -}}
    {%- endif -%}
{%- endif -%}
"""
)
