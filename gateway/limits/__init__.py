"""Who the client is and what it may spend: API keys (auth, globs), admission, rate limits (GCRA in process
or on Redis through the script channel), token estimates, usage accounting and budgets by reservation.

May import upstream, fleet, ops and the base; never emulation, resilience, cache, ledger, path or edge.
"""
