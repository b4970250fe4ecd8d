"""What of a vLLM server's `/tokenizer_info` answer a client is shown.

vLLM answers its tokenizer's init kwargs (less `vocab_file` and `merges_file`), `tokenizer_class` and the chat
template. A Hugging Face tokenizer's init kwargs also hold where the server read it from (`name_or_path`,
`tokenizer_file`, ...: paths on its disk) and the keyword arguments it was loaded with. A client tokenizes
with the rest; these are the server's. docs/clients.md#tokenizer-routes-and-the-model-scoped-base-path.
"""

from __future__ import annotations

from typing import Any, Final

# Init kwargs that are the server's business, not the tokenizer's: the credential and download settings it
# was loaded with (`from_pretrained`'s keyword arguments end up among them), and private bookkeeping.
_SERVER_KEYS: Final = frozenset(
    {"token", "use_auth_token", "cache_dir", "download_dir", "local_files_only", "trust_remote_code", "revision"}
)
# A file or directory the tokenizer was read from (`tokenizer_file`, `special_tokens_map_file`, a model's own
# `spm_file`, ...): a path on the server's disk.
_PATH_SUFFIXES: Final = ("_file", "_files", "_dir", "_path")


def _local_path(value: str) -> bool:
    """Text that reads as a path on the server (absolute, home- or dot-relative, a Windows drive)."""
    return value.startswith(("/", "~", "./", "../", "\\")) or (len(value) > 2 and value[1] == ":" and value[2] in "/\\")


def _server_only(key: str, value: Any) -> bool:
    """Whether the init kwarg `key` tells of the server rather than of its tokenizer (dropped from the answer)."""
    if key.startswith("_") or key in _SERVER_KEYS or key.endswith(_PATH_SUFFIXES):
        return True
    # A path under any other name; a token's text (`eos_token: "/"`) or the chat template is never one.
    return isinstance(value, str) and not key.endswith("_token") and key != "chat_template" and _local_path(value)


def client_info(info: dict[str, Any], model: str) -> dict[str, Any]:
    """`info` without what tells of the server rather than of its tokenizer. `model`: the name the server was
    asked for the model by (the client's, or the operator's for an alias)."""
    return {k: v for k, v in info.items() if (_named(v, model) if k == "name_or_path" else not _server_only(k, v))}


def _named(name_or_path: Any, model: str) -> bool:
    """Whether `name_or_path` may be shown: a Hub id (`facebook/opt-125m`) or where the server read the
    tokenizer from, and a relative directory (`models/llama`) reads just like an id, so only the model's own
    name, which whoever asks knows already, and never one that reads as a path."""
    return name_or_path == model and not _local_path(model)


__all__ = ["client_info"]
