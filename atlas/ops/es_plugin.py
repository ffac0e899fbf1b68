"""The `atlas-analysis` Elasticsearch plugin, built from `es-plugin/` into the local distribution.

The integ-test-zip distribution lacks the `analysis-common` module, and the `.security`
system index is analysed with its `whitespace` tokenizer and `pattern_capture` and `unique`
filters: without them the node cannot create API keys or native roles. The module is not
published on Maven Central, so Atlas compiles a tiny replacement against the jars in the
distribution's `lib/` with the JDK that runs the node.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from atlas.config import REPO_ROOT
from atlas.ops.errors import ClusterError

PLUGIN_NAME = "atlas-analysis"
# es-plugin/ ships beside the package in the checkout.
SOURCE_DIR = REPO_ROOT / "es-plugin"
DESCRIPTOR = "plugin-descriptor.properties"
HASH_FILE = "source.sha256"


def _sources() -> list[Path]:
    return sorted((SOURCE_DIR / "src").rglob("*.java"))


def source_hash() -> str:
    """SHA-256 over the descriptor and Java sources: a change in either means a rebuild."""
    digest = hashlib.sha256()
    for path in (SOURCE_DIR / DESCRIPTOR, *_sources()):
        digest.update(path.relative_to(SOURCE_DIR).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def install_analysis_plugin(dist: Path, java_home: Path) -> None:
    """Compile and install the plugin into `{dist}/plugins/atlas-analysis/`; a no-op when up to date.

    A plugin folder is just its jar and `plugin-descriptor.properties`; the source hash is
    written last, so an interrupted install is redone at the next call.
    """
    target = dist / "plugins" / PLUGIN_NAME
    digest = source_hash()
    hash_path = target / HASH_FILE
    if hash_path.is_file() and hash_path.read_text().strip() == digest:
        return
    javac = java_home / "bin" / "javac"
    if not javac.is_file():
        raise ClusterError(
            f"{java_home} has no javac, needed to build the {PLUGIN_NAME} Elasticsearch plugin: "
            f"set ES_JAVA_HOME to a full JDK >= 21"
        )
    with tempfile.TemporaryDirectory(prefix="atlas-es-plugin-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [str(javac), "--release", "21", "-encoding", "UTF-8", "-cp", f"{dist / 'lib'}/*",
               "-d", str(classes), *map(str, _sources())]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ClusterError(f"javac could not build the {PLUGIN_NAME} Elasticsearch plugin:\n{done.stderr.strip()}")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        with zipfile.ZipFile(target / f"{PLUGIN_NAME}.jar", "w", zipfile.ZIP_DEFLATED) as jar:
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
    shutil.copy2(SOURCE_DIR / DESCRIPTOR, target / DESCRIPTOR)
    hash_path.write_text(digest + "\n")
