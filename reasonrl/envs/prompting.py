"""How a dataset row's prompt offers its environment's tools: the one place that decides
(``reasonrl.data.prompts.render_prompt`` asks it for every row).

A row that names an environment whose call format is hermes (``<tool_call>{json}</tool_call>``, the format chat
templates with tools ask for) offers that environment's ``@tool`` schemas (``Environment.declared_tools``). When the
tokenizer's chat template reads ``tools`` (``template_supports_tools``) they go to ``apply_chat_template(tools=...)``
and the template writes them its own way; otherwise (SmolLM2's template, or no template) they are written into the
system message as ``describe_tools`` text, as the rows carried them before. Rows written with that text already in
their system message (a data cache from before) are rendered the same: the text is not added twice, and is taken out
when the template gets ``tools=``. Rows of inline formats (``fenced_python``: the task's own text teaches it), rows
with no environment and rows naming an unknown one offer no tools here.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .chat import template_supports_tools
from .parsers import describe_tools
from .registry import get_environment_class

TEMPLATE_TOOL_PARSERS = ("hermes",)
"""Call formats whose tools a chat template renders (``tools=``) or ``describe_tools`` describes."""


def row_tools(row: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The tools the prompt of dataset ``row`` offers: its environment's ``@tool`` schemas when the environment's
    call format is in ``TEMPLATE_TOOL_PARSERS``; [] otherwise."""
    name = (row or {}).get("environment")
    if not name:
        return []
    try:
        cls = get_environment_class(name)
    except KeyError:  # an unknown environment fails its trajectories at rollout, naming the known ones
        return []
    return cls.declared_tools() if cls.parser in TEMPLATE_TOOL_PARSERS else []


def offer_tools(tokenizer: Any, messages: List[Dict[str, str]], tools: List[Dict[str, Any]],
                use_template: bool) -> Tuple[List[Dict[str, str]], Optional[List[Dict[str, Any]]]]:
    """(messages, the ``tools=`` for ``apply_chat_template`` or None): the prompt's messages offering ``tools``.
    ``use_template``: the prompt is rendered with the tokenizer's chat template."""
    if not tools:
        return messages, None
    text = describe_tools(tools)
    messages = [dict(m) for m in messages]
    system = messages[0] if messages and messages[0].get("role") == "system" else None
    if use_template and template_supports_tools(tokenizer):
        if system is not None and text in system["content"]:
            system["content"] = system["content"].replace("\n\n" + text, "").replace(text, "")
            if not system["content"]:
                messages = messages[1:]
        return messages, list(tools)
    if system is None:
        messages.insert(0, {"role": "system", "content": text})
    elif text not in system["content"]:
        system["content"] = system["content"] + "\n\n" + text
    return messages, None
