"""A model folder's tokenizer and chat template as the proxy uses them, without transformers on the path.

`ChatTokenizer` holds the Rust tokenizer (`tokenizers.Tokenizer`), the chat template source and the named
special tokens, and renders with `apply_chat_template` the way transformers (5.x) does it for the plain
JSON messages the proxy hands over:

- each message's keys whose value is None are dropped (`content: null` of a tool-calling turn);
- a message's reasoning is given as `reasoning_content` and, first among its keys, `thinking` (gpt-oss
  templates read that one), from whichever of `reasoning_content`, `thinking`, `reasoning` is set;
- the template runs in jinja2's immutable sandbox with `trim_blocks` and `lstrip_blocks`, the
  `loopcontrols` extension and the `{% generation %}` tag, a `tojson` filter that does not escape HTML,
  and the globals `raise_exception`, `strftime_now`, `dict` and `namespace`;
- the named special tokens (`bos_token`, `eos_token`, ...) are template variables; a model with several
  named templates renders `tool_use` when tools are given and it has one, else `default`.

What the folder's files mean (which special tokens, which template, the tokenizer transformers builds from
them) is read by transformers itself, once per folder, and kept (render/snapshot.py): importing
transformers 5 takes ~1.2 s (it reads every model module's source to build its lazy import table), a
`record`'s first call would wait for it. tests/render/test_chat_template.py renders the real templates
through both and compares the texts, so a transformers release that renders differently fails there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTokenizer:
    """A tokenizer with its chat template: what render/renderer.py, render/family.py and the SFT export read.

    `chat_template` is the source, or a dict of named sources; `special_tokens` the named special tokens
    (bos_token, eos_token, unk_token, ...) as strings."""

    def __init__(
        self,
        backend: Tokenizer,
        chat_template: str | dict[str, str] | None,
        special_tokens: Mapping[str, str],
    ) -> None:
        self.backend_tokenizer = backend
        self.chat_template = chat_template
        self.special_tokens_map = dict(special_tokens)

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        eos = self.eos_token
        return None if eos is None else self.backend_tokenizer.token_to_id(eos)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        if isinstance(tokens, str):
            return self.backend_tokenizer.token_to_id(tokens)
        return [self.backend_tokenizer.token_to_id(t) for t in tokens]

    def get_added_vocab(self) -> dict[str, int]:
        """Added token text -> ID, as transformers lists it."""
        return {t.content: i for i, t in sorted(self.backend_tokenizer.get_added_tokens_decoder().items())}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def template_source(self, tools: Sequence[Any] | None = None) -> str:
        """The template to render: the only one, or of several named ones `tool_use` (with tools, when
        there is one) else `default`. ValueError when there is none to pick."""
        template = self.chat_template
        if isinstance(template, dict):
            if tools is not None and "tool_use" in template:
                return template["tool_use"]
            if "default" in template:
                return template["default"]
            raise ValueError(
                f"The model has several chat templates ({', '.join(sorted(template))}) and none named 'default'."
            )
        if not template:
            raise ValueError("The tokenizer has no chat template.")
        return template

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        """The template's text for `conversation` (the renderer tokenizes it: Renderer.encode). Extra keyword
        arguments are template variables. Raises jinja2's TemplateError where the template refuses the
        conversation."""
        if not conversation:
            raise ValueError("Cannot apply a chat template to an empty conversation.")
        template = compiled(self.template_source(tools))
        text: str = template.render(
            messages=[_template_message(m) for m in conversation],
            tools=tools,  # as given: the sandbox is immutable, the template cannot change them
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )
        return text


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as transformers hands it to the template: keys with None values left out, the reasoning
    under `thinking` (first) and `reasoning_content`."""
    out = {k: v for k, v in message.items() if v is not None}
    reasoning = next((out[k] for k in _REASONING_KEYS if k in out), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


@lru_cache(maxsize=32)
def compiled(source: str) -> Any:
    """The template compiled in the environment described in the module's doc (cached by source)."""
    return _environment().from_string(source)


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: its body, as is (transformers tracks where it lies
        for assistant masks; the proxy masks by the sampled tokens instead)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()  # type: ignore[no-any-return]

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore-prefixed attributes (no reach into CPython internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # self inside args, as jinja2.utils.Namespace has it
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}."
                )

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
