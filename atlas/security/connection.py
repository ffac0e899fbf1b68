"""`connect()`: an `elasticsearch.Elasticsearch` client for the configured cluster, checked once.

Every failure a newcomer meets on day one (cluster down, wrong password, a 8.x server
behind a 9.x client) becomes a one-line `ConnectionFailed` that says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import elasticsearch
from elastic_transport import ApiResponse
from elasticsearch import Elasticsearch, OrjsonSerializer

from atlas.config import Settings, load_settings
from atlas.core.errors import ConnectionFailed
from atlas.security.secrets import read_secret

CLIENT_MAJOR = int(elasticsearch.__versionstr__.split(".")[0])


def client_options(settings: Settings, *, operator: bool = False) -> dict:
    """URLs, credentials and CA of Atlas's service credential, or with `operator` of the operator's.

    The service credential is the least-privilege user that `atlas es up` (local node) or
    `atlas service create` (any cluster) made, unless ES_API_KEY / ES_USERNAME name another. The
    operator's is the local node's `elastic`, or on another cluster whatever ES_* say. A local
    multi-node cluster gives every node's URL: the client spreads requests over them and moves on
    from a node that stops answering.
    """
    if settings.local:
        path = settings.local_credentials_path if operator else settings.service_credentials_path
        creds = read_secret(path)
        if creds is None or creds.get("url") != settings.url:
            raise ConnectionFailed(
                f"no credentials for the local node at {settings.url} in {path}: run `make es-up` (or `atlas es up`), "
                "which starts the node and makes Atlas's service user, or set ES_URL to use another cluster"
            )
        return {"hosts": settings.node_urls, "basic_auth": (creds["username"], creds["password"])}
    options: dict = {"hosts": [settings.es_url]}
    service = None if operator else read_secret(settings.service_credentials_path)
    if settings.es_api_key:
        options["api_key"] = settings.es_api_key
    elif settings.es_username:
        options["basic_auth"] = (settings.es_username, settings.es_password or "")
    elif service is not None and service.get("url") == settings.es_url:
        options["basic_auth"] = (service["username"], service["password"])
    if settings.es_ca_certs:
        options["ca_certs"] = settings.es_ca_certs
    return options


class AtlasClient(Elasticsearch):
    """The client `connect()` returns: a lost or timed-out connection raises `ConnectionFailed`.

    Every layer talks to Elasticsearch through this client, so callers catch one `AtlasError`
    whatever call was in flight. Only transport failures are mapped; API errors (404, 409, ...)
    keep their classes for the layers that handle them. Nothing is cached: the next call after
    the node is back simply succeeds.
    """

    def perform_request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                        headers: Mapping[str, str] | None = None, body: Any | None = None,
                        endpoint_id: str | None = None,
                        path_parts: Mapping[str, Any] | None = None) -> ApiResponse[Any]:
        try:
            return super().perform_request(method, path, params=params, headers=headers, body=body,
                                           endpoint_id=endpoint_id, path_parts=path_parts)
        except (elasticsearch.ConnectionError, elasticsearch.ConnectionTimeout) as exc:
            urls = ", ".join(node.base_url for node in self.transport.node_pool.all())
            reason = " ".join(str(getattr(exc, "message", exc)).split())
            raise ConnectionFailed(
                f"Elasticsearch at {urls} is not answering ({reason}): start it (`make es-up`) or fix ES_URL, "
                "then retry; the client reconnects by itself"
            ) from exc


def connect(settings: Settings | None = None, *, api_key: str | None = None, operator: bool = False,
            check: bool = True, request_timeout: float = 30) -> Elasticsearch:
    """A client with the service credential, or with `api_key` (a user's key), or with `operator` the
    operator's (set-up only: `atlas es up`, `atlas service create`).

    `check` makes one request so that a broken setup fails here, with advice, rather
    than deep inside a recall.
    """
    settings = settings or load_settings()
    options = client_options(settings, operator=operator)
    if api_key is not None:
        options.pop("basic_auth", None)
        options["api_key"] = api_key
    # orjson parses JSON about four times faster: a write's neighbours and a recall's pool come back with their
    # vectors, hundreds of kilobytes of floats (15 ms for a write's with the standard library, 4 with orjson).
    es = AtlasClient(**options, request_timeout=request_timeout, max_retries=1, retry_on_timeout=False,
                     serializer=OrjsonSerializer())
    if check:
        check_connection(es, settings.url, user_key=api_key is not None)
    return es


def check_connection(es: Elasticsearch, url: str, *, user_key: bool = False) -> None:
    """Raise `ConnectionFailed` unless the cluster answers this credential with our major version."""
    try:
        if user_key:
            es.security.authenticate()
            return
        nodes = es.nodes.info(node_id="_all", metric="_none", filter_path="nodes.*.version")
    except elasticsearch.ConnectionError:
        raise ConnectionFailed(
            f"Elasticsearch at {url} is not answering: start the local node with `make es-up`, or fix ES_URL"
        ) from None
    except elasticsearch.AuthenticationException:
        raise ConnectionFailed(
            f"Elasticsearch at {url} refused the credentials: check ES_API_KEY / ES_USERNAME / ES_PASSWORD, "
            "or for the local node the file written by `make es-up`"
        ) from None
    except elasticsearch.UnsupportedProductError as exc:
        raise ConnectionFailed(f"{url} is not an Elasticsearch server this client supports: {exc}") from None
    except elasticsearch.BadRequestError as exc:
        # An older server refuses the 9.x client's `compatible-with=9` media type outright.
        if "compatible" in str(exc).lower() or "accept version" in str(exc).lower():
            raise ConnectionFailed(version_problem(["unknown (older than 9)"], url)) from None
        raise
    problem = version_problem([info["version"] for info in nodes.get("nodes", {}).values()], url)
    if problem:
        raise ConnectionFailed(problem)


def version_problem(versions: list[str], url: str) -> str | None:
    """What to do when the cluster's major version is not the client's, or None when it is."""
    wrong = sorted({v for v in versions if not v.startswith(f"{CLIENT_MAJOR}.")})
    if not wrong:
        return None
    return (f"the cluster at {url} runs Elasticsearch {', '.join(wrong)} but the Python client is "
            f"{elasticsearch.__versionstr__}: install the client of the cluster's major version "
            f"(e.g. `pip install 'elasticsearch>=8,<9'`) or use a {CLIENT_MAJOR}.x cluster")


def server_version(es: Elasticsearch) -> str:
    """The version of the (first) node; `GET /` is missing from the integ-test distribution."""
    nodes = es.nodes.info(node_id="_all", metric="_none", filter_path="nodes.*.version")["nodes"]
    return next(iter(nodes.values()))["version"]
