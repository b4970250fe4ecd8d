"""The 429 of a request some rate bucket had no room for, and whether it was the key's team's limit.

A team's buckets (`teams.<name>.limits`) are shared by all of its keys, so a key refused by them may have
sent nothing for a while: the answer says so, in its message and in `x-gateway-team`, as a provider's
quota says `x-gateway-provider`. Which bucket refused is read back off the refusal's reply, which gives
every bucket's headroom before the charge: only built for a refusal, never for an admitted request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gateway.limits.gcra import TOKEN_KINDS, Bucket
from gateway.limits.rateheaders import Lines, as_text
from wire.errors import RateLimitError

# The endpoint writes it as every header value is (gateway/server/values.py: percent-encoded outside printable
# ASCII), so a team named in any script is safe to name.
TEAM_HEADER: Final = "x-gateway-team"


def team_scope(team: str) -> str:
    """The scope of `team`'s buckets: how they are named to operators, and in Redis (`rl:{team:<name>}:rpm`)."""
    return f"team:{team}"


def team_refused(team: str, buckets: Sequence[Bucket], remaining: Sequence[int], tokens: int) -> bool:
    """Whether `team`'s buckets among `buckets` refused a request charged one request and `tokens`, from each
    bucket's headroom before the charge (`remaining`, the refusal's reply). A rate bucket refused when its
    headroom is below its cost. A concurrency bucket reads 0 both when it was full and when the request would
    have taken its last slot: the team's is named only when no other bucket can have refused instead."""
    scope = team_scope(team)
    sure = [False, False]  # [another scope's, the team's]: a rate bucket that certainly refused
    maybe = [False, False]  # a concurrency bucket with no slot left after this request
    for b, left in zip(buckets, remaining, strict=True):
        mine = b.scope == scope
        if b.kind == "concurrent":
            if left <= 0:
                maybe[mine] = True
        elif left < (tokens if b.kind in TOKEN_KINDS else 1):
            sure[mine] = True
    return sure[True] or (not sure[False] and maybe[True] and not maybe[False])


def refusal(
    team: str | None,
    buckets: Sequence[Bucket],
    remaining: Sequence[int],
    tokens: int,
    wait_ms: int,
    headers: Lines,
) -> RateLimitError:
    """The 429 `rate_limit_exceeded` of a refused admission, with Retry-After and the x-ratelimit `headers`;
    `team`: the key's team when its buckets are among `buckets`, named when they refused."""
    text = as_text(headers)
    if team is not None and team_refused(team, buckets, remaining, tokens):
        text[TEAM_HEADER] = team
        message = (
            f"Rate limit reached for team '{team}', shared by all of its keys; retry after the time in Retry-After"
        )
    else:
        message = "Rate limit reached for this key or model; retry after the time in Retry-After"
    return RateLimitError(message, code="rate_limit_exceeded", retry_after=wait_ms / 1000, headers=text)
