"""VMware Private AI Services (seed 004): `.../api/v1/compatibility/openai/v1/completions`.

The seed documents only these request fields, a string prompt, and `stop` as a non-empty array.
"""

from __future__ import annotations

from providers.base import Param, stop_list, table
from providers.chat_fields import NO_NAMES
from providers.chat_params import chat_table
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OpenAICompatible


class PAISAdapter(OpenAIChat, OpenAICompatible):
    kind = "pais"
    auth = "`Authorization: Bearer` when api_key is set"
    needs_api_key = False
    needs_base_url = True
    model_listing = ("/models", False)
    prompt_forms = frozenset({"text"})
    params = table(
        temperature=Param(),
        n=Param(),
        stop=Param(convert=stop_list),
        max_tokens=Param(),
        seed=Param(),
    )
    chat_params = chat_table(params)
    # Its API reference's ChatCompletionsRequestMessage is role, content, tool_calls, refusal and tool_call_id:
    # no `name`, which it would drop unread or refuse.
    chat_names = NO_NAMES
