"""Tokenizer routes of self-hosted servers, spoken in vLLM's dialect to the client.

Each adapter class declares `tokenizer`: which of vLLM's `/tokenize`, `/detokenize`, `/tokenizer_info` its
server has and how a request and its answer translate (`NO_TOKENIZER` by default, in providers/base.py).
Pure like the adapters; gateway/edge/tokenizer_routes.py does the I/O. Shapes per server and their sources:
docs/provider-notes.md#tokenizer.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

import msgspec
from msgspec import Meta

from providers.tokenizer_info import client_info
from wire.chat import Tool
from wire.errors import InvalidRequestError
from wire.messages import Message, bound_conversation
from wire.schema import check_depth, no_chat_template

TokenizerRoute = Literal["tokenize", "detokenize", "tokenizer_info"]
ROUTES: Final[tuple[TokenizerRoute, ...]] = ("tokenize", "detokenize", "tokenizer_info")


# -- the client's side: vLLM's request and answer shapes ------------------------------------------------


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(msgspec.Struct, kw_only=True):
    """vLLM's chat form of `/tokenize`: the conversation as the served model's own chat template renders it."""

    messages: list[Message]
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # None: as the server's own chat route tokenizes the rendered text (vLLM: none added, its template writes
    # the special tokens it wants; llama-server: its BOS added).
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # as sent: checked as chat's `tools` are


class TokenizeBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a client may send to `/tokenize`: a prompt (vLLM's `TokenizeCompletionRequest`) or a conversation
    (its `TokenizeChatRequest`, less `chat_template`: a template is the server's configuration)."""

    prompt: str | None = None
    messages: Annotated[list[Message], Meta(min_length=1)] | None = None
    model: str | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = False
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


_CHAT_ONLY: Final = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools")


def tokenize_request(
    body: TokenizeBody, depth: int, messages: int, parts: int
) -> TokenizeRequest | TokenizeChatRequest:
    """The one form `body` asks for, with vLLM's defaults for that form; a 400 naming the field otherwise.
    A conversation is held to the chat route's caps: `depth` bounds the nesting of the free-form fields
    (`caps.json_depth`), `messages` and `parts` its size (`caps.chat_messages`, `caps.chat_content_parts`)."""
    if body.messages is None:
        if body.prompt is None:
            raise InvalidRequestError(
                "'prompt' or 'messages' is required", param="prompt", code="missing_required_parameter"
            )
        for name in _CHAT_ONLY:
            if getattr(body, name) is not None:
                raise InvalidRequestError(f"'{name}' is only taken with 'messages'", param=name, code="invalid_value")
        special = True if body.add_special_tokens is None else body.add_special_tokens
        return TokenizeRequest(
            prompt=body.prompt, model=body.model, add_special_tokens=special, return_token_strs=body.return_token_strs
        )
    if body.prompt is not None:
        raise InvalidRequestError("give 'prompt' or 'messages', not both", param="prompt", code="invalid_value")
    generation = True if body.add_generation_prompt is None else body.add_generation_prompt
    if generation and body.continue_final_message:
        raise InvalidRequestError(
            "'continue_final_message' cannot be true with 'add_generation_prompt' true",
            param="continue_final_message",
            code="invalid_value",
        )
    # Before anything reads the conversation; the openai SDK's echoes of a parsed answer are cleared with it.
    bound_conversation(body.messages, messages, parts, depth)
    no_chat_template(body.chat_template_kwargs)
    for name in ("chat_template_kwargs", "tools"):
        value = getattr(body, name)
        if value is not None:
            check_depth(value, depth, name)
    if body.tools is not None:
        try:
            msgspec.convert(body.tools, list[Tool])
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(
                f"Invalid value for 'tools': {exc}", param="tools", code="invalid_value"
            ) from None
    return TokenizeChatRequest(
        messages=body.messages,
        model=body.model,
        add_generation_prompt=generation,
        continue_final_message=bool(body.continue_final_message),
        add_special_tokens=body.add_special_tokens,
        return_token_strs=body.return_token_strs,
        chat_template_kwargs=body.chat_template_kwargs,
        tools=body.tools,
    )


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # vLLM's own bound (a token id is an int64 there); negative ids are refused before any upstream sees them.
    tokens: list[Annotated[int, Meta(ge=0, le=2**63 - 1)]]
    model: str | None = None


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    # vLLM answers `null` when the strings were not asked for; so does the gateway.
    token_strs: list[str] | None = None


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class Call(msgspec.Struct, frozen=True):
    """One upstream request: `path` is appended to the server's root URL."""

    method: Literal["GET", "POST"]
    path: str
    body: bytes | None = None


class Tokenized(msgspec.Struct, frozen=True):
    tokens: list[int]
    token_strs: list[str] | None
    # None when the answer does not say; the route's `limits` call then tells it.
    max_model_len: int | None


class TokenizerAPI:
    """A server without tokenizer routes. Subclasses name theirs in `routes` and translate each one."""

    routes: ClassVar[frozenset[TokenizerRoute]] = frozenset()
    # Whether its `/tokenize` also takes a conversation (`tokenize_chat`), rendered by the server's template.
    chat: ClassVar[bool] = False
    # Whether the conversation is rendered by one call (`tokenize_chat`, read by `read_rendered`) and its text
    # then tokenized by another (`tokenize`), for a server whose `/tokenize` takes text alone.
    renders: ClassVar[bool] = False
    # Where the context size comes from when the tokenize answer lacks it (asked once per upstream model).
    limits: ClassVar[Call | None] = None

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        raise NotImplementedError

    def tokenize_chat(self, req: TokenizeChatRequest, model: str, provider: str) -> Call:
        raise NotImplementedError

    def read_rendered(self, body: bytes, req: TokenizeChatRequest) -> TokenizeRequest:
        raise NotImplementedError

    def read_tokenize(self, body: bytes, req: TokenizeRequest | TokenizeChatRequest) -> Tokenized:
        raise NotImplementedError

    def detokenize(self, req: DetokenizeRequest, model: str) -> Call:
        raise NotImplementedError

    def read_detokenize(self, body: bytes) -> str:
        raise NotImplementedError

    def tokenizer_info(self) -> Call:
        raise NotImplementedError

    def read_tokenizer_info(self, body: bytes, model: str) -> bytes:
        """The answer a client is shown; `model` is the name the server was asked for the model by."""
        raise NotImplementedError

    def read_limits(self, body: bytes) -> int | None:
        return None


NO_TOKENIZER: Final = TokenizerAPI()


def _json(value: Any) -> bytes:
    return msgspec.json.encode(value)


# -- vLLM: the client's own dialect, with the model name rewritten -------------------------------------


class _VLLMTokenized(msgspec.Struct):
    tokens: list[int]
    max_model_len: int | None = None
    token_strs: list[str] | None = None


class _VLLMDetokenized(msgspec.Struct):
    prompt: str


_read_vllm_tokenized: Final = msgspec.json.Decoder(_VLLMTokenized).decode
_read_vllm_detokenized: Final = msgspec.json.Decoder(_VLLMDetokenized).decode
_read_object: Final = msgspec.json.Decoder(dict[str, Any]).decode


class VLLMTokenizer(TokenizerAPI):
    routes: ClassVar[frozenset[TokenizerRoute]] = frozenset(ROUTES)
    chat: ClassVar[bool] = True

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        body: dict[str, Any] = {"model": model, "prompt": req.prompt, "add_special_tokens": req.add_special_tokens}
        if req.return_token_strs:
            # Only when asked: a vLLM older than the field (2025) may refuse a body that names it.
            body["return_token_strs"] = True
        return Call("POST", "/tokenize", _json(body))

    def tokenize_chat(self, req: TokenizeChatRequest, model: str, provider: str) -> Call:
        body = msgspec.structs.asdict(req)
        body["model"] = model
        body["add_special_tokens"] = bool(req.add_special_tokens)  # vLLM's chat default: none added
        if not req.return_token_strs:
            del body["return_token_strs"]  # as for a prompt
        for name in ("chat_template_kwargs", "tools"):
            if body[name] is None:
                del body[name]
        return Call("POST", "/tokenize", _json(body))

    def read_tokenize(self, body: bytes, req: TokenizeRequest | TokenizeChatRequest) -> Tokenized:
        up = _read_vllm_tokenized(body)
        strs = up.token_strs if req.return_token_strs else None
        if strs is not None and len(strs) != len(up.tokens):
            # A string per token, or the client pairs each id with another's text.
            raise msgspec.ValidationError(f"{len(up.tokens)} tokens and {len(strs)} token strings")
        return Tokenized(up.tokens, strs, up.max_model_len)

    def detokenize(self, req: DetokenizeRequest, model: str) -> Call:
        return Call("POST", "/detokenize", _json({"model": model, "tokens": req.tokens}))

    def read_detokenize(self, body: bytes) -> str:
        return _read_vllm_detokenized(body).prompt

    def tokenizer_info(self) -> Call:
        return Call("GET", "/tokenizer_info")

    def read_tokenizer_info(self, body: bytes, model: str) -> bytes:
        # vLLM answers its tokenizer's init kwargs (less `vocab_file` and `merges_file`), `tokenizer_class` and
        # the chat template: what a client tokenizes with stays, the server's own filesystem and settings go.
        return _json(client_info(_read_object(body), model))


# -- llama.cpp ------------------------------------------------------------------------------------------


class _LlamaPiece(msgspec.Struct):
    id: int
    piece: str | list[int] = ""


class _LlamaTokenized(msgspec.Struct):
    tokens: list[int | _LlamaPiece]


class _LlamaDetokenized(msgspec.Struct):
    content: str


class _LlamaRendered(msgspec.Struct):
    prompt: str


class _LlamaSettings(msgspec.Struct):
    n_ctx: int | None = None


class _LlamaProps(msgspec.Struct):
    default_generation_settings: _LlamaSettings | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None


_read_llama_tokenized: Final = msgspec.json.Decoder(_LlamaTokenized).decode
_read_llama_detokenized: Final = msgspec.json.Decoder(_LlamaDetokenized).decode
_read_llama_rendered: Final = msgspec.json.Decoder(_LlamaRendered).decode
_read_llama_props: Final = msgspec.json.Decoder(_LlamaProps).decode


def _piece_text(piece: str | list[int]) -> str:
    # A piece that is not valid UTF-8 comes as its bytes; written the way Hugging Face tokenizers name
    # byte-fallback tokens (`<0xC3>`), so a string per token still says what the token is.
    if isinstance(piece, str):
        return piece
    return "".join(f"<0x{b & 0xFF:02X}>" for b in piece)


class LlamaCppTokenizer(TokenizerAPI):
    routes: ClassVar[frozenset[TokenizerRoute]] = frozenset(ROUTES)
    limits: ClassVar[Call | None] = Call("GET", "/props")
    # llama-server's `/apply-template` renders a conversation as its chat route does (the same parser reads
    # `add_generation_prompt`, `continue_final_message`, `chat_template_kwargs` and `tools`); its `/tokenize`
    # then takes the text.
    chat: ClassVar[bool] = True
    renders: ClassVar[bool] = True

    def tokenize_chat(self, req: TokenizeChatRequest, model: str, provider: str) -> Call:
        body: dict[str, Any] = {"model": model, "messages": req.messages}
        body["add_generation_prompt"] = req.add_generation_prompt
        if req.continue_final_message:
            body["continue_final_message"] = True  # vLLM's pair; an older build continues by its prefill
        if req.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = req.chat_template_kwargs
        if req.tools is not None:
            body["tools"] = req.tools
        return Call("POST", "/apply-template", _json(body))

    def read_rendered(self, body: bytes, req: TokenizeChatRequest) -> TokenizeRequest:
        # Its chat route tokenizes the rendered text with the special tokens added (the BOS its templates leave
        # out): so does the count, unless the client says otherwise.
        special = req.add_special_tokens
        return TokenizeRequest(
            prompt=_read_llama_rendered(body).prompt,
            add_special_tokens=True if special is None else special,
            return_token_strs=req.return_token_strs,
        )

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        # `model` picks the model on a llama-server running several (router mode), as for /completion.
        body = {
            "model": model,
            "content": req.prompt,
            "add_special": req.add_special_tokens,
            "with_pieces": bool(req.return_token_strs),
        }
        return Call("POST", "/tokenize", _json(body))

    def read_tokenize(self, body: bytes, req: TokenizeRequest | TokenizeChatRequest) -> Tokenized:
        items = _read_llama_tokenized(body).tokens
        ids = [t if isinstance(t, int) else t.id for t in items]
        strs: list[str] | None = None
        if req.return_token_strs:
            strs = [_piece_text(t.piece) if isinstance(t, _LlamaPiece) else "" for t in items]
        return Tokenized(ids, strs, None)

    def detokenize(self, req: DetokenizeRequest, model: str) -> Call:
        return Call("POST", "/detokenize", _json({"model": model, "tokens": req.tokens}))

    def read_detokenize(self, body: bytes) -> str:
        return _read_llama_detokenized(body).content

    def read_limits(self, body: bytes) -> int | None:
        settings = _read_llama_props(body).default_generation_settings
        return settings.n_ctx if settings is not None else None

    def tokenizer_info(self) -> Call:
        return Call("GET", "/props")

    def read_tokenizer_info(self, body: bytes, model: str) -> bytes:
        # vLLM's answer is the tokenizer's settings (a Hugging Face tokenizer's init kwargs); llama-server's
        # /props has the ones a client reads from it: the BOS and EOS tokens as text, the chat template and
        # the context size (`model_max_length`, as Hugging Face calls it).
        props = _read_llama_props(body)
        settings = props.default_generation_settings
        info: dict[str, Any] = {
            "tokenizer_class": "llama.cpp",
            "bos_token": props.bos_token or None,
            "eos_token": props.eos_token or None,
        }
        if props.chat_template:
            info["chat_template"] = props.chat_template
        if settings is not None and settings.n_ctx is not None:
            info["model_max_length"] = settings.n_ctx
        return _json(info)


# -- TGI --------------------------------------------------------------------------------------------------


class _TGIToken(msgspec.Struct):
    id: int
    text: str = ""


class _TGIInfo(msgspec.Struct):
    max_total_tokens: int | None = None


class _TGIChatTokenized(msgspec.Struct):
    tokenize_response: list[_TGIToken]


_read_tgi_tokenized: Final = msgspec.json.Decoder(list[_TGIToken]).decode
_read_tgi_info: Final = msgspec.json.Decoder(_TGIInfo).decode
_read_tgi_chat_tokenized: Final = msgspec.json.Decoder(_TGIChatTokenized).decode


def _cannot(provider: str, param: str, why: str, asked: str | None = None) -> InvalidRequestError:
    """What TGI cannot do, named: `asked` is the request's value as the message quotes it (the field alone
    by default)."""
    return InvalidRequestError(
        f"Provider '{provider}' (TGI) {why}; '{asked or param}' cannot be honoured",
        param=param,
        code="unsupported_parameter",
    )


class TGITokenizer(TokenizerAPI):
    routes: ClassVar[frozenset[TokenizerRoute]] = frozenset({"tokenize"})
    limits: ClassVar[Call | None] = Call("GET", "/info")
    # `POST /chat_tokenize` takes a Messages API body and answers the templated text's tokens as `/tokenize`
    # does (router/src/server.rs `get_chat_tokenize`): the conversation as its chat route renders it, the
    # assistant's turn opened, no special tokens added beyond the template's (`try_into_generate`).
    chat: ClassVar[bool] = True

    def tokenize_chat(self, req: TokenizeChatRequest, model: str, provider: str) -> Call:
        if req.continue_final_message:
            raise _cannot(provider, "continue_final_message", "cannot continue a final assistant message")
        if not req.add_generation_prompt:
            raise _cannot(provider, "add_generation_prompt", "always opens the assistant's turn")
        if req.chat_template_kwargs is not None:
            raise _cannot(provider, "chat_template_kwargs", "takes no chat template variables")
        if req.add_special_tokens:
            raise _cannot(provider, "add_special_tokens", "adds no special tokens beyond the chat template's")
        # `model` names a LoRA adapter on TGI's Messages API unless it is "tgi" (`try_into_generate`).
        body: dict[str, Any] = {"model": "tgi", "messages": req.messages}
        if req.tools is not None:
            body["tools"] = req.tools
        return Call("POST", "/chat_tokenize", _json(body))

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        if not req.add_special_tokens:
            # TGI tokenizes as /generate does, special tokens included: an answer without them would be wrong.
            why = "always adds the tokenizer's special tokens"
            raise _cannot(provider, "add_special_tokens", why, "add_special_tokens: false")
        return Call("POST", "/tokenize", _json({"inputs": req.prompt}))

    def read_tokenize(self, body: bytes, req: TokenizeRequest | TokenizeChatRequest) -> Tokenized:
        if isinstance(req, TokenizeChatRequest):
            items = _read_tgi_chat_tokenized(body).tokenize_response
        else:
            items = _read_tgi_tokenized(body)
        return Tokenized([t.id for t in items], [t.text for t in items] if req.return_token_strs else None, None)

    def read_limits(self, body: bytes) -> int | None:
        return _read_tgi_info(body).max_total_tokens


VLLM_TOKENIZER: Final = VLLMTokenizer()
LLAMACPP_TOKENIZER: Final = LlamaCppTokenizer()
TGI_TOKENIZER: Final = TGITokenizer()


def server_root(base_url: str) -> str:
    """The server's root URL from a provider's base URL: vLLM's ends with `/v1` (its OpenAI routes), while
    its tokenizer routes, like llama.cpp's and TGI's, sit at the root."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


__all__ = [
    "LLAMACPP_TOKENIZER",
    "NO_TOKENIZER",
    "ROUTES",
    "TGI_TOKENIZER",
    "VLLM_TOKENIZER",
    "Call",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "TokenizeBody",
    "TokenizeChatRequest",
    "TokenizeRequest",
    "TokenizeResponse",
    "Tokenized",
    "TokenizerAPI",
    "TokenizerRoute",
    "server_root",
    "tokenize_request",
]
