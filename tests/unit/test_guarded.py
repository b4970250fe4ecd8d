"""`guarded_paths`: the upstream body paths carrying the prompt, the token limit and the choice counts, which
`inference_extra_params` may not write under the provider's own names (providers/guarded.py)."""

from __future__ import annotations

from typing import Any

import pytest

from providers import REGISTRY, register
from providers.base import Adapter, Endpoint, Param, table
from providers.guarded import ExtraMerge, guarded_write, limit_paths
from tests.helpers.adapters import build, request
from wire.errors import InvalidRequestError

PROMPT = "prompt-marker-5d1c"
LIMIT = 4321


def _paths(node: Any, want: Any, prefix: str = "") -> list[str]:
    """Dotted paths (object keys only: a list ends the path) of the places in `node` holding `want`."""
    if node == want:
        return [prefix]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _paths(v, want, f"{prefix}.{k}" if prefix else k)]
    if isinstance(node, list):
        return [prefix for v in node if _paths(v, want, prefix)][:1]
    return []


def _endpoint() -> Endpoint:
    return Endpoint(
        provider="p", model="m", base_url="http://127.0.0.1:9", api_key="AKIDEXAMPLE:secret", region="us-east-1"
    )


def _covered(path: str, guarded: frozenset[str]) -> bool:
    return any(path == g or path.startswith(g + ".") for g in guarded)


@pytest.mark.parametrize("kind", list(REGISTRY))
def test_every_kind_guards_where_it_writes_the_limit_counts_and_prompt(kind: str) -> None:
    cls = REGISTRY[kind]
    assert limit_paths(cls.params) <= cls.guarded_paths
    assert "max_tokens" in cls.params and limit_paths(cls.params), kind  # every kind maps a token limit natively
    if not issubclass(cls, Adapter):
        return  # in process: no upstream body
    _, body, _ = build(cls(), request(prompt=PROMPT, max_tokens=LIMIT), _endpoint())
    prompt_at, limit_at = _paths(body, PROMPT), _paths(body, LIMIT)
    assert prompt_at and limit_at, body
    for path in prompt_at + limit_at:
        assert _covered(path, cls.guarded_paths), (kind, path, sorted(cls.guarded_paths))


@pytest.mark.parametrize(
    ("kind", "extra", "path"),
    # OpenAI's names at the top level (`max_tokens`, `n`, ...) are refused for every kind before routing
    # (gateway/path/request.py); these are the providers' own.
    [
        ("llamacpp", {"n_predict": -1}, "n_predict"),
        ("tgi", {"parameters": {"max_new_tokens": 100000}}, "parameters.max_new_tokens"),
        ("tgi", {"parameters": {"best_of": 16}}, "parameters.best_of"),
        ("tgi", {"inputs": "another prompt"}, "inputs"),
        ("ollama", {"options": {"num_predict": -1}}, "options.num_predict"),
        ("ollama", {"options": {"NUM_PREDICT": -1}}, "options.num_predict"),  # Go matches names in any case
        ("ollama", {"Options": {"temperature": 1}}, "options.num_predict"),  # would replace the mapped options
        ("gemini", {"generationConfig": {"maxOutputTokens": 65536}}, "generationConfig.maxOutputTokens"),
        ("gemini", {"generationConfig": {"candidateCount": 8}}, "generationConfig.candidateCount"),
        ("gemini", {"generation_config": {"temperature": 1}}, "generationConfig.candidateCount"),  # snake_case
        ("gemini", {"generationConfig": None}, "generationConfig.candidateCount"),
        ("bedrock", {"inferenceConfig": {"maxTokens": 100000}}, "inferenceConfig.maxTokens"),
        ("bedrock", {"messages": []}, "messages"),
        ("cohere", {"messages": []}, "messages"),
        ("vllm", {"prompt_embeds": "AAAA"}, "prompt_embeds"),
    ],
)
def test_writes_to_a_guarded_path_are_refused_naming_it(kind: str, extra: dict[str, Any], path: str) -> None:
    cls = REGISTRY[kind]
    assert issubclass(cls, Adapter)
    req = request(prompt="hi", max_tokens=5, temperature=0.5, inference_extra_params=extra)
    with pytest.raises(InvalidRequestError) as caught:
        build(cls(), req, _endpoint())
    assert caught.value.param == f"inference_extra_params.{path}"
    assert f"'{path}'" in caught.value.message


@pytest.mark.parametrize(
    ("kind", "extra", "where"),
    [
        ("llamacpp", {"n_keep": 4, "cache_prompt": False}, "n_keep"),
        ("tgi", {"parameters": {"decoder_input_details": False}}, "parameters.decoder_input_details"),
        ("ollama", {"options": {"num_ctx": 8192}, "keep_alive": "5m"}, "options.num_ctx"),
        ("gemini", {"generationConfig": {"responseMimeType": "text/plain"}}, "generationConfig.responseMimeType"),
        ("bedrock", {"additionalModelRequestFields": {"top_k": 5}}, "additionalModelRequestFields.top_k"),
        ("anthropic", {"system": "Be brief."}, "system"),
        ("openai", {"logit_bias": {"50256": -100}}, "logit_bias"),
    ],
)
def test_other_native_fields_still_pass_and_keep_the_limit(kind: str, extra: dict[str, Any], where: str) -> None:
    cls = REGISTRY[kind]
    assert issubclass(cls, Adapter)
    _, body, _ = build(cls(), request(prompt=PROMPT, max_tokens=LIMIT, inference_extra_params=extra), _endpoint())
    node: Any = body
    for key in where.split("."):
        node = node[key]
    assert node is not None
    assert _paths(body, LIMIT) and _paths(body, PROMPT)


@pytest.mark.parametrize(
    ("how", "extra", "hit"),
    [
        ("deep", {"a": {"b": {"c": 1}}}, "a.b.c"),
        ("deep", {"a": {"b": {"d": 1}}}, None),
        ("deep", {"a": {"b": 1}}, "a.b.c"),  # replaces the object holding the guarded field
        ("nested", {"a": {"b": {"d": 1}}}, "a.b.c"),  # nested merges one level: a.b is put in whole
        ("nested", {"a": {"x": 1}}, None),
        ("top", {"a": {"x": 1}}, "a.b.c"),  # top replaces `a` whole
        ("top", {"z": {"b": {"c": 1}}}, None),
        ("deep", {"A": {"x": 1}}, "a.b.c"),  # another spelling is another key: merged as a whole object
        ("deep", {"a": {"B_": {}}}, "a.b.c"),
        ("deep", {}, None),
    ],
)
def test_guarded_write_follows_the_merge(how: ExtraMerge, extra: dict[str, Any], hit: str | None) -> None:
    assert guarded_write(extra, frozenset({"a.b.c", "q"}), how) == hit


def test_a_kind_that_writes_its_limit_to_an_unguarded_path_is_not_registered() -> None:
    class Unguarded(Adapter):
        kind = "unguarded_test_kind"
        params = table(max_tokens=Param(to="limits.output"), n=Param(to="count"))
        guarded_paths = frozenset({"limits.output"})

        def build_request(self, req: Any, endpoint: Any, body: Any) -> Any:
            raise NotImplementedError

        def parse_response(self, body: Any, ctx: Any) -> Any:
            raise NotImplementedError

        def parse_event(self, event: Any, data: Any, ctx: Any) -> Any:
            raise NotImplementedError

        def map_error(self, status: Any, headers: Any, body: Any, provider: Any) -> Any:
            raise NotImplementedError

    with pytest.raises(ValueError, match=r"\['count'\] are missing"):
        register(Unguarded)
    assert "unguarded_test_kind" not in REGISTRY
