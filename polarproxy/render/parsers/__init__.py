"""Tool-call parsers, one module per model family, behind one interface (`base.ToolParser`).

`PARSERS` maps each `--tool-format` name to its parser; `polarproxy.render.family` detects which one a
model's chat template and tokenizer call for.
"""

from __future__ import annotations

from polarproxy.choices import TOOL_FORMATS
from polarproxy.render.parsers.base import Output, ToolParser
from polarproxy.render.parsers.deepseek import DeepSeekParser
from polarproxy.render.parsers.harmony import HarmonyParser
from polarproxy.render.parsers.hermes import HermesParser
from polarproxy.render.parsers.llama_json import LlamaJsonParser
from polarproxy.render.parsers.mistral import MistralParser
from polarproxy.render.parsers.qwen_xml import QwenXmlParser

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen-xml": QwenXmlParser,
    "llama-json": LlamaJsonParser,
    "deepseek": DeepSeekParser,
    "mistral": MistralParser,
    "harmony": HarmonyParser,
}
# the formats are declared in polarproxy/choices.py; a test ties PARSERS to them
# Families whose format carries its own reasoning channel (reasoning tags do not apply).
OWN_REASONING: frozenset[str] = frozenset({"harmony"})

__all__ = ["OWN_REASONING", "PARSERS", "TOOL_FORMATS", "Output", "ToolParser"]
