"""Azure OpenAI: the model name is the Azure deployment id, auth is the `api-key` header.

`azure/<deployment-id>` calls the provider's resource; `azure/<deployment-id>/<name>` calls the
resource of the gateway deployment `<name>` (a region), with its own base URL and key.
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import quote

from providers.base import Endpoint, Param, path_segment
from providers.chat_params import chat_table
from providers.openai_chat import OpenAIChat
from providers.openai_compat import OpenAICompatible

DEFAULT_API_VERSION = "2024-10-21"


class AzureAdapter(OpenAIChat, OpenAICompatible):
    kind = "azure"
    genai_provider = "azure.ai.openai"
    auth = "`api-key`"
    needs_base_url = True
    credential_headers = frozenset({"api-key"})
    openai_bpe = True
    deployment_renames_model = False  # the model already is the deployment id, in the URL
    path: ClassVar[str] = "/openai/deployments/{model}/completions?api-version={api_version}"
    chat_path: ClassVar[str] = "/openai/deployments/{model}/chat/completions?api-version={api_version}"
    chat_refusal = True  # OpenAI's message fields, `refusal` among them, as on OpenAI
    chat_results_paired = True  # OpenAI's service: its 400 for a tool message answering no call of its turn
    # The chat API's current name for the limit, as on OpenAI.
    chat_params = chat_table(
        OpenAICompatible.params,
        max_tokens=Param(to="max_completion_tokens"),
        reasoning_effort=Param(),
        verbosity=Param(),
        # Stored completions, the prompt-cache key and the end-user id (learn.microsoft.com, Foundry's
        # "Create chat completion" reference); the tier, per request, for deployments with priority
        # processing (Foundry's "Enable priority processing" page, API versions from 2025-10-01-preview).
        store=Param(),
        metadata=Param(),
        prompt_cache_key=Param(),
        safety_identifier=Param(),
        service_tier=Param(),
    )

    def url(self, endpoint: Endpoint) -> str:
        # A deployment id is one segment of letters, digits, `_`, `-` and `.` (the client's text: encoded,
        # and refused when it holds a `/` or is `.`/`..`).
        version = endpoint.api_version or DEFAULT_API_VERSION
        return (
            f"{endpoint.base_url.rstrip('/')}/openai/deployments/{path_segment(endpoint.model, endpoint.provider)}"
            f"/completions?api-version={quote(version, safe='')}"
        )

    def auth_headers(self, endpoint: Endpoint) -> dict[str, str]:
        return {"api-key": endpoint.api_key} if endpoint.api_key else {}

    def chat_url(self, endpoint: Endpoint) -> str:
        return self.url(endpoint).replace("/completions?", "/chat/completions?", 1)
