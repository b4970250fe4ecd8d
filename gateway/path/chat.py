"""A chat request's attempts: the same job, failover loop, quotas and relay as a completion's, with the
adapter's chat route (providers/openai_chat.py) in place of its completion route.

A kind without one answers a 400 naming the provider before any I/O; the gateway's completion emulations
(fan-out, stops cut from the text, guided checks) are not applied to chat: a field the provider cannot
honour is refused by its table.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, cast

from gateway.path.attempt import Attempt, Job, Opened, _fresh, ignored_n, parsed, sane_usage
from providers.base import LocalAdapter, map_params
from providers.openai_chat import OpenAIChat, check_chat, chunks_from, from_completion, unsupported_endpoint
from wire.chat import ChatCompletion, ChatRequest


class ChatAttempt(Attempt):
    """One attempt of a chat job on one route: one upstream call to the kind's chat route."""

    __slots__ = ()

    def _chat(self) -> tuple[OpenAIChat | LocalAdapter, ChatRequest, dict[str, Any]]:
        route = self.route
        adapter = route.adapter
        table = adapter.chat_params
        if table is None or not isinstance(adapter, OpenAIChat | LocalAdapter):
            raise unsupported_endpoint(route.provider, adapter.kind)
        req = cast(ChatRequest, self.req)  # a ChatJob holds a ChatRequest
        check_chat(adapter, req, route.provider)
        if isinstance(adapter, LocalAdapter):
            adapter.admit(req, route.endpoint, self.services.caps)  # its work runs on the gateway's loop
        params, lost = map_params(req, table, route.provider, route.drop_unsupported)
        if lost:
            self.dropped[route.key] = lost
        return adapter, req, params

    def complete(self) -> Coroutine[Any, Any, ChatCompletion]:
        return self.chat()

    async def chat(self) -> ChatCompletion:
        adapter, req, params = self._chat()
        route = self.route
        ctx = _fresh(self.ctx)
        if isinstance(adapter, LocalAdapter):
            self.sent += 1
            return from_completion(await adapter.complete(req, route.endpoint, ctx))
        body = await self.exchange(adapter, adapter.build_chat_request(req, route.endpoint, params))
        answer = parsed(route, adapter.parse_chat_response, body, ctx)
        asked = req.n or 1
        if asked > 1 and len(answer.choices) < asked:
            self.services.ignores_n.add(route.key)
            raise ignored_n(route, asked, len(answer.choices))
        if answer.usage is not None:
            answer.usage = sane_usage(answer.usage)
        return answer

    async def open(self) -> Opened:
        adapter, req, params = self._chat()
        route = self.route
        ctx = _fresh(self.ctx)
        if isinstance(adapter, LocalAdapter):
            self.sent += 1
            local = chunks_from(adapter.stream(req, route.endpoint, ctx))
            return Opened(local, await anext(local, None), ctx=ctx)
        asked = req.n or 1
        if asked > 1 and route.key in self.services.ignores_n:
            raise ignored_n(route, asked, 1)
        upstream_req = adapter.build_chat_request(req, route.endpoint, params)
        self.sent += 1
        stream = await self.services.upstream.open_stream(route.provider, upstream_req, self.timeouts, route.key)
        return await self.first_event(stream, adapter, adapter.parse_chat_event, adapter.chat_framing, ctx)


class ChatJob(Job):
    """A chat request as the failover loop sees it: a `Job` whose attempts call the chat route."""

    __slots__ = ()
    attempt = ChatAttempt


__all__ = ["ChatAttempt", "ChatJob"]
