"""Tool calls in the model's own output format, parsed into OpenAI `tool_calls` (one parser per format).

`parser_for(tokenizer)` picks the format from the model's chat template; `ToolCallStream` turns streamed text into
content and complete tool calls.
"""

from local_engine.prompt.tool_calls.base import ToolCall, ToolCallFormat, ToolCallStream
from local_engine.prompt.tool_calls.hermes import HermesFormat

_FORMATS: tuple[type[ToolCallFormat], ...] = (HermesFormat,)


def format_for(tokenizer) -> ToolCallFormat:
    """The tool-call format of this model: the first whose marker its chat template mentions, else the Hermes
    `<tool_call>` format, which is also how this engine renders earlier tool calls into the prompt for templates
    without tool support (SmolLM2's)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    for fmt in _FORMATS:
        if fmt.template_marker in template:
            return fmt()
    return HermesFormat()


__all__ = ["ToolCall", "ToolCallFormat", "ToolCallStream", "format_for"]
