"""The ledger: every answered request as a row, daily rollups, runtime client keys, reports, retention.

This wing owns the durable record of what the gateway did and who may call it beyond the YAML keys:
the schema and its migrations (`schema`), the two engines (`engine`: SQLite embedded, PostgreSQL for
fleets), the writer that commits rows in batches and spills them while the database is away (`book`),
the runtime keys and their propagation to every replica (`keys`), and the admin routes over them
(`routes`). It may import `gateway.config`, `wire` and the lower wings (usage prices, auth's key
values, metrics' `Record`); it is never imported by the request path itself, which only calls
`Ledger.append` (one append to a bounded queue) through the hook the app installs. Docs: docs/ledger.md.
"""
