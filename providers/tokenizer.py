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

from wire.errors import InvalidRequestError

TokenizerRoute = Literal["tokenize", "detokenize", "tokenizer_info"]
ROUTES: Final[tuple[TokenizerRoute, ...]] = ("tokenize", "detokenize", "tokenizer_info")


# -- the client's side: vLLM's request and answer shapes ------------------------------------------------


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


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
    # Where the context size comes from when the tokenize answer lacks it (asked once per upstream model).
    limits: ClassVar[Call | None] = None

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        raise NotImplementedError

    def read_tokenize(self, body: bytes, req: TokenizeRequest) -> Tokenized:
        raise NotImplementedError

    def detokenize(self, req: DetokenizeRequest, model: str) -> Call:
        raise NotImplementedError

    def read_detokenize(self, body: bytes) -> str:
        raise NotImplementedError

    def tokenizer_info(self) -> Call:
        raise NotImplementedError

    def read_tokenizer_info(self, body: bytes) -> bytes:
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

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        body: dict[str, Any] = {"model": model, "prompt": req.prompt, "add_special_tokens": req.add_special_tokens}
        if req.return_token_strs:
            # Only when asked: a vLLM older than the field (2025) may refuse a body that names it.
            body["return_token_strs"] = True
        return Call("POST", "/tokenize", _json(body))

    def read_tokenize(self, body: bytes, req: TokenizeRequest) -> Tokenized:
        up = _read_vllm_tokenized(body)
        return Tokenized(up.tokens, up.token_strs if req.return_token_strs else None, up.max_model_len)

    def detokenize(self, req: DetokenizeRequest, model: str) -> Call:
        return Call("POST", "/detokenize", _json({"model": model, "tokens": req.tokens}))

    def read_detokenize(self, body: bytes) -> str:
        return _read_vllm_detokenized(body).prompt

    def tokenizer_info(self) -> Call:
        return Call("GET", "/tokenizer_info")

    def read_tokenizer_info(self, body: bytes) -> bytes:
        _read_object(body)  # a JSON object, or the answer is unreadable; relayed as the upstream wrote it
        return body


# -- llama.cpp ------------------------------------------------------------------------------------------


class _LlamaPiece(msgspec.Struct):
    id: int
    piece: str | list[int] = ""


class _LlamaTokenized(msgspec.Struct):
    tokens: list[int | _LlamaPiece]


class _LlamaDetokenized(msgspec.Struct):
    content: str


class _LlamaSettings(msgspec.Struct):
    n_ctx: int | None = None


class _LlamaProps(msgspec.Struct):
    default_generation_settings: _LlamaSettings | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None


_read_llama_tokenized: Final = msgspec.json.Decoder(_LlamaTokenized).decode
_read_llama_detokenized: Final = msgspec.json.Decoder(_LlamaDetokenized).decode
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

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        # `model` picks the model on a llama-server running several (router mode), as for /completion.
        body = {
            "model": model,
            "content": req.prompt,
            "add_special": req.add_special_tokens,
            "with_pieces": bool(req.return_token_strs),
        }
        return Call("POST", "/tokenize", _json(body))

    def read_tokenize(self, body: bytes, req: TokenizeRequest) -> Tokenized:
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

    def read_tokenizer_info(self, body: bytes) -> bytes:
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


_read_tgi_tokenized: Final = msgspec.json.Decoder(list[_TGIToken]).decode
_read_tgi_info: Final = msgspec.json.Decoder(_TGIInfo).decode


class TGITokenizer(TokenizerAPI):
    routes: ClassVar[frozenset[TokenizerRoute]] = frozenset({"tokenize"})
    limits: ClassVar[Call | None] = Call("GET", "/info")

    def tokenize(self, req: TokenizeRequest, model: str, provider: str) -> Call:
        if not req.add_special_tokens:
            # TGI tokenizes as /generate does, special tokens included: an answer without them would be wrong.
            raise InvalidRequestError(
                f"Provider '{provider}' (TGI) always adds the tokenizer's special tokens; "
                "'add_special_tokens: false' cannot be honoured",
                param="add_special_tokens",
                code="unsupported_parameter",
            )
        return Call("POST", "/tokenize", _json({"inputs": req.prompt}))

    def read_tokenize(self, body: bytes, req: TokenizeRequest) -> Tokenized:
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
    "TokenizeRequest",
    "TokenizeResponse",
    "Tokenized",
    "TokenizerAPI",
    "TokenizerRoute",
    "server_root",
]
