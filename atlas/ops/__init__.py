"""The local Elasticsearch node: fetch, configure, start and stop it (`cluster`), the analysis
plugin it needs (`es_plugin`), and what a cluster supports (`capabilities`)."""
