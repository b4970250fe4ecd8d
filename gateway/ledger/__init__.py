"""The ledger: every answered request as a row, daily rollups, runtime client keys, budgets, reports, retention.

This wing owns the durable record of what the gateway did and who may call it beyond the YAML keys: the
schema and its migrations (`schema`), the engines (`engine`: SQLite embedded, PostgreSQL for fleets), the
writer that commits rows in batches and spills them while the database is away (`book`), budgets seeded
from its rollups (`budgets`), runtime keys polled by every replica (`keys`), reports (`report`), the app's
handle (`service`) and `serve`'s checks before workers fork (`startup`). Its admin routes are the edge's.
The request path holds it through slots the app fills (`Pipeline.ledger`, `.budgets`). Docs: docs/ledger.md.

May import limits, upstream, ops and the base; never resilience, emulation or cache (the other wings of
its layer), path or edge.
"""
