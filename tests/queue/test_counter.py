"""The virtual token counter's arithmetic: what a grant charges, what an answer's end corrects, and how a
tenant's estimate follows its answers. The order is driven directly (no server), then once through a gateway
for a request without max_tokens."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from gateway.limits.tokens import prompt_tokens
from gateway.queue.fair import MAX_CHARGE, FairOrder, Waiter
from tests.helpers.engine import Engine
from tests.helpers.servers import serve_config
from tests.queue.conftest import _headers, body, chat_body, config, gate, until


def _waiter(tenant: str) -> Waiter:
    return Waiter(tenant, 1.0, 1, 0, None, 0.0)


def test_a_tenant_that_starts_waiting_is_not_overtaken_by_refunds_of_a_backlogged_ones_running_requests() -> None:
    order = FairOrder()
    for _ in range(3):  # `noisy` runs three requests, each charged its max_tokens of 97 and a 3-token prompt
        order.charge("noisy", 100, 0, 1.0)
    for _ in range(5):
        order.push(_waiter("noisy"))
    order.push(_waiter("quiet"))  # starts waiting: level with `noisy`, and served longer ago
    order.settle("noisy", 100, 3, 20, 1.0)  # one of noisy's requests ends, far shorter than charged
    # Had the refund lowered noisy's count at once, noisy would now be below `quiet` and take this slot.
    assert order.pop().tenant == "quiet"  # type: ignore[union-attr]
    assert order.pop().tenant == "noisy"  # type: ignore[union-attr]


def test_a_refund_comes_off_the_tenants_next_charges_so_its_service_is_what_it_used() -> None:
    order = FairOrder()
    order.charge("t", 100, 0, 1.0)
    order.settle("t", 100, 3, 20, 1.0)  # 80 charged too much
    assert order.service["t"] == 100 and order.credit["t"] == 80
    order.charge("t", 50, 0, 1.0)  # paid out of the credit
    assert order.service["t"] == 100 and order.credit["t"] == 30
    order.charge("t", 50, 0, 1.0)  # the rest of the credit, then 20 more
    assert order.service["t"] == 120 and "t" not in order.credit  # 20 + 50 + 50 used
    order.settle("t", 50, 3, 90, 1.0)  # a longer answer than charged: charged at once
    assert order.service["t"] == 160
    order.charge("w", 30, 0, 3.0)  # a weight divides the tokens
    order.settle("w", 30, 3, 15, 3.0)
    assert order.service["w"] == 10 and order.credit["w"] == 5


def test_a_credit_is_no_banked_time_a_tenant_that_starts_waiting_settles_it_before_its_lift() -> None:
    order = FairOrder()
    order.charge("quiet", 100, 0, 1.0)
    order.settle("quiet", 100, 3, 10, 1.0)  # 90 of credit, then idle while `noisy` is served
    for _ in range(4):
        order.charge("noisy", 40, 0, 1.0)
    order.push(_waiter("noisy"))
    order.push(_waiter("quiet"))
    # Its own count less its credit (10) is below noisy's 160: lifted there, the credit spent on the way.
    assert order.service["quiet"] == 160 and "quiet" not in order.credit


def test_the_charge_follows_the_tenants_recent_answers_within_its_max_tokens() -> None:
    order = FairOrder()
    assert order.charge("t", 3, 200, 1.0) == 203  # nothing known yet: its prompt and the most it may generate
    order.settle("t", 203, 3, 43, 1.0)  # generated 40
    assert order.charge("t", 3, 200, 1.0) == 43
    assert order.charge("t", 3, 25, 1.0) == 28  # never past the request's own bound
    order.settle("t", 43, 3, 0, 1.0)  # an attempt that ended without an answer teaches nothing
    assert order.charge("t", 3, 200, 1.0) == 43
    for _ in range(30):  # the tenant moves to longer answers: the estimate follows
        order.settle("t", 43, 3, 123, 1.0)
    assert 118 <= order.charge("t", 3, 10**6, 1.0) <= 123
    # One huge max_tokens is charged at most MAX_CHARGE for its answer until its usage is known.
    assert order.charge("new", 5, 10**9, 1.0) == 5 + MAX_CHARGE


def test_a_tenant_whose_prompts_the_estimate_misses_is_charged_their_real_tokens_once_its_answers_say_so() -> None:
    order = FairOrder()
    # Estimated at 3 prompt tokens, really 5 (the usage says so), 16 generated of max_tokens 16.
    first = order.charge("t", 3, 16, 1.0)
    assert first == 19
    order.settle("t", first, 3, 21, 1.0, real=5)
    assert order.service["t"] == 21 and not order.credit  # the 2 the estimate missed, charged at once
    for _ in range(5):  # steady requests: each charged what it uses, so its end has nothing to correct
        assert order.charge("t", 3, 16, 1.0) == 21
    assert order.service["t"] == 21 * 6
    # The generated part stays within the request's own max_tokens; the prompt's miss is added to it.
    assert order.charge("t", 3, 4, 1.0) == 3 + 2 + 4
    # An estimate that overcounts lowers the charge, never below the generated part.
    order.settle("u", order.charge("u", 40, 10, 1.0), 40, 12, 1.0, real=2)
    assert order.charge("u", 40, 10, 1.0) == 2 + 10
    # A usage that does not add up (a prompt larger than the total) teaches only the length, as before.
    order.settle("v", order.charge("v", 3, 10, 1.0), 3, 8, 1.0, real=50)
    assert "v" not in order.misses and order.lengths["v"] == 5


def test_a_charge_rounds_the_learned_length_and_miss_as_the_estimate_always_did() -> None:
    # The estimate: the prompt, the learned answer length rounded half up (the whole `most` when the length
    # reaches it, `MAX_CHARGE` at most) and the learned prompt miss rounded half to even, never below -prompt.
    def expected(order: FairOrder, tenant: str, prompt: int, most: int) -> int:
        length = order.lengths.get(tenant)
        generated = most if length is None or length >= most else int(length + 0.5)
        miss = order.misses.get(tenant)
        return prompt + min(generated, MAX_CHARGE) + (max(round(miss), -prompt) if miss is not None else 0)

    order = FairOrder()
    # Prompts estimated at 3 tokens, really 5, 9, 2...: lengths and misses that fall on halves (16 then 20
    # generated: 16.5; a miss of 2 then 6: 2.5) and between them (each answer moves them by an eighth).
    for used, real in [(21, 5), (29, 9), (17, 2), (12, 3), (40_005, 5), (2, 2), (3, None), (25, 2), (14, 2)]:
        for prompt, most in [(3, 16), (3, 15), (0, 4), (1, 0), (3, 100_000), (40, 10)]:
            assert order.charge("t", prompt, most, 1.0) == expected(order, "t", prompt, most)
        order.settle("t", 0, 3, used, 1.0, real)
    assert order.misses["t"] % 1 and order.lengths["t"] % 1  # still fractional after the last answer


async def test_a_request_without_max_tokens_is_charged_the_budgets_worst_case_then_its_tenants_answers(
    tmp_path: Path, engine: Engine
) -> None:
    text = config(engine, 1, extra="caps: {budget_max_tokens: 500}")
    req = {"model": "engine/m", "prompt": "quiet hello there"}  # the engine answers one token
    prompt = prompt_tokens(req["prompt"], False, "")
    with serve_config(tmp_path, text) as gw:
        order = gate(gw).order
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            first = await client.post("/v1/completions", json=req, headers=_headers("quiet", {}))
            await until(lambda: gate(gw).in_use == 0)
            # Charged its prompt and the budgets' worst case (the vllm adapter's own default is smaller)...
            assert order.service["quiet"] == prompt + 500
            assert order.credit["quiet"] == prompt + 500 - 4  # ...and it used 3 + 1: the rest is owed back
            assert order.lengths["quiet"] == 1  # what it generated, as its usage says
            assert order.misses["quiet"] == 3 - prompt  # what the prompt's estimate missed of its real 3 tokens
            engine.running.clear()
            second = asyncio.ensure_future(client.post("/v1/completions", json=req, headers=_headers("quiet", {})))
            await until(lambda: engine.inflight == 1)
            # Now charged what its answers were (paid from its credit): the worst case only without history.
            assert order.credit["quiet"] == prompt + 500 - 4 - 4
            engine.running.set()
            assert (await second).status_code == 200
    assert first.status_code == 200


async def test_a_chat_is_charged_the_tools_it_sends_with_its_messages(tmp_path: Path, engine: Engine) -> None:
    """Tool definitions are billed as prompt: a chat's grant charges their JSON's estimate with its messages'."""
    tools = [{"type": "function", "function": {"name": "f", "description": "look it up " * 40, "parameters": {}}}]
    req = chat_body("quiet", 1, tools=tools)
    rendered = prompt_tokens("user: quiet hello there\n", False, "")
    prompt = rendered + prompt_tokens(json.dumps(tools, separators=(",", ":")), False, "")
    with serve_config(tmp_path, config(engine, 1)) as gw:
        order = gate(gw).order
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            answer = await client.post("/v1/chat/completions", json=req, headers=_headers("quiet", {}))
            await until(lambda: gate(gw).in_use == 0)
    assert answer.status_code == 200, answer.text
    assert order.service["quiet"] == prompt + 1  # its prompt and its max_completion_tokens, with no history


async def test_a_completion_is_charged_what_it_sends_beside_its_prompt(tmp_path: Path, engine: Engine) -> None:
    """A suffix and the escape hatch's fields are billed as prompt: a completion's grant charges their estimate
    with its prompt's, as a chat's charges its tools."""
    extra = {"documents": ["look it up " * 40]}
    suffix = "the end " * 30
    req = body("quiet", 1, suffix=suffix, inference_extra_params=extra)
    prompt = prompt_tokens("quiet hello there", False, "")
    prompt += prompt_tokens(json.dumps(extra, separators=(",", ":")) + "\n" + suffix, False, "")
    with serve_config(tmp_path, config(engine, 1)) as gw:
        order = gate(gw).order
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            answer = await client.post("/v1/completions", json=req, headers=_headers("quiet", {}))
            await until(lambda: gate(gw).in_use == 0)
    assert answer.status_code == 200, answer.text
    assert order.service["quiet"] == prompt + 1  # its prompt and its max_tokens, with no history
