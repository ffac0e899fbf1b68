"""The `atlas` command line. Each group calls one layer of the package; nothing is implemented here."""

from __future__ import annotations

import json

import typer

from . import cluster
from .errors import AtlasError

app = typer.Typer(help="Atlas: long-term agent memory on Elasticsearch.", no_args_is_help=True)
es_app = typer.Typer(help="The local Elasticsearch node (ignored when ES_URL is set).", no_args_is_help=True)
app.add_typer(es_app, name="es")


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


@app.command("archive")
def archive_cmd(older_than: str = typer.Option("90d", "--older-than", help="superseded longer ago than this"),
                prefix: str | None = typer.Option(None, help="index prefix (default ATLAS_INDEX_PREFIX)")) -> None:
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
               prefix: str | None = typer.Option(None, help="index prefix (default ATLAS_INDEX_PREFIX)")) -> None:
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


if __name__ == "__main__":
    app()
