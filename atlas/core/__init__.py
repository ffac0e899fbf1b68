"""The memory layer itself, and nothing above it: what a reader takes in at one sitting.

`constants` (every tunable and vocabulary), `errors`, `clock`, `config`, `validation`,
`connection`, `schemas` (the indices), `scoring` (decay, use, priors), `passages` (what of a turn
is embedded), `documents` (build, index, prove ownership, update with optimistic concurrency),
`memory` (writes), `supersession`, `fusion` (RRF and the second stage's vote), `hubness` (what the vote holds
against small talk), `recall`, `tenancy` (per-user DLS keys), `privacy` (erase, export, import), `tokens` (what
tenants hold) and `store` (the handles, and the two model protocols).
Its only third-party imports are the Elasticsearch client, numpy and tqdm: the models, the local
node and every surface sit above it (the layers contract in pyproject.toml).
"""
