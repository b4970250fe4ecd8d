"""What the gateway does for a provider that cannot: fan-out of `n`/`best_of`, stop sequences, echo,
guided choice, regex and JSON schema, with the client's patterns and schemas admitted and bounded.

May import limits, upstream, ops and the base; never path, resilience or edge.
"""
