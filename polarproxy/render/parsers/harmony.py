"""gpt-oss harmony, parsed from the decoded text (no `openai-harmony`, whose vocabulary download these machines
cannot reach; see docs/usage.md).

The answer is a run of messages, each `[<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]
<|message|>CONTENT` ended by `<|end|>`, `<|call|>` or `<|return|>` (the last two are stop tokens, so the
text usually just ends). The `analysis` channel is reasoning; a message to `functions.NAME` is a tool call
whose content is its arguments (streamed as sampled when they start with `{`); `final` and other
`commentary` messages are text. Text that is no harmony message at all is text.
"""

from __future__ import annotations

import re

from polarproxy.render.parsers.base import Machine, could_start, find_first, partial_suffix

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CONTENT_ENDS = (*ENDS, START)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
MAX_HEADER = 512


class HarmonyParser(Machine):
    mode = "header"

    def on_header(self) -> bool:
        head = self.buf.lstrip()
        if not (head.startswith((START, CHANNEL)) or could_start(head, (START, CHANNEL))):
            self.mode = "text"
            return True
        i = self.buf.find(MESSAGE)
        if i < 0:
            if len(self.buf) > MAX_HEADER:  # no header after all: its first character is text, then read on
                self.out.text(self.buf[0])
                self.drop(1)
                self.mode = "text"
                return True
            return False
        header = self.buf[:i]
        self.take(i + len(MESSAGE))
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient:
            self._name = recipient.group(1).removeprefix("functions.")
            self.mode = "call"
            return True
        self.raw = ""
        self.mode = "reasoning" if channel and channel.group(1) == "analysis" else "message"
        if self.mode == "reasoning":
            self.out.reasoning("")  # an empty analysis message is still reasoning
        return True

    def _content(self) -> tuple[str, bool]:
        """The content up to the end of the message (`True` once it ended; its end tag is consumed)."""
        i, tag = find_first(self.buf, _CONTENT_ENDS)
        if i < 0:
            keep = partial_suffix(self.buf, _CONTENT_ENDS)
            text = self.buf[: len(self.buf) - keep]
            self.drop(len(text))
            return text, False
        text = self.buf[:i]
        self.drop(i + (len(tag) if tag != START else 0))
        self.raw = ""
        return text, True

    def on_reasoning(self) -> bool:
        text, ended = self._content()
        self.out.reasoning(text)
        if ended:
            self.mode = "header"
        return ended

    def on_message(self) -> bool:
        text, ended = self._content()
        self.out.text(text)
        if ended:
            self.mode = "header"
        return ended

    def on_call(self) -> bool:
        head = self.buf.lstrip()
        if not head:
            return False
        if head.startswith("{"):
            self.out.open_call(self._name)
            self.raw = ""
            self.drop(len(self.buf) - len(head))
            self.mode = "call_args"
        else:
            self._whole = ""
            self.mode = "call_whole"
        return True

    def on_call_args(self) -> bool:
        text, ended = self._content()
        self.out.args(text)
        if ended:
            self.out.close_call()
            self.mode = "header"
        return ended

    def on_call_whole(self) -> bool:
        """Arguments that are not a JSON object (a built-in tool's code, say): the call goes out whole."""
        text, ended = self._content()
        self._whole += text
        if ended:
            self.out.whole_call(self._name, self._whole.strip())
            self.mode = "header"
        return ended

    def on_text(self) -> bool:
        """Text outside any message, up to the next `<|start|>`."""
        if self.text_until((START,)) is None:
            return False
        self.buf = self.raw + self.buf  # the start tag begins the next header
        self.raw = ""
        self.mode = "header"
        return True

    def finish_markup(self) -> None:
        if self.mode in ("reasoning", "message", "call_args", "call_whole"):
            rest, self.buf = self.buf, ""
            if self.mode == "reasoning":
                self.out.reasoning(rest)
            elif self.mode == "message":
                self.out.text(rest)
            elif self.mode == "call_args":
                self.out.args(rest)
                self.out.close_call()
            else:
                self.out.whole_call(self._name, (self._whole + rest).strip())
        elif self.mode == "call":
            self.out.whole_call(self._name, self.buf.strip())
            self.buf = ""
        else:  # an unfinished header
            self.out.text(self.raw + self.buf)
            self.buf = ""
        self.raw = ""
        self.mode = "text"
