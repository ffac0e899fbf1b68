"""Run the numbered notebooks end to end with papermill, and summarise what they produced.

    atlas notebooks run --out outputs/notebooks [--only NN]
    atlas notebooks summary

Each notebook `notebooks/NN_*.ipynb` runs in order, in its own folder, with the kernel
`python3` and two injected parameters: `INDEX_PREFIX` (unique per run, `nb-NN-<random>`,
so runs never share indices) and `OUT_DIR` (the absolute outputs folder, where figures
and metrics go). The first failure stops the run and names the notebook, the cell and
the error; the failed notebook's indices are dropped.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from atlas.config import Settings, load_settings

#: `NN_name.ipynb`: two digits, an underscore, a name.
NOTEBOOK_NAME = re.compile(r"^(\d{2})_[A-Za-z0-9_-]+\.ipynb$")
KERNEL = "python3"


def notebooks_dir(settings: Settings | None = None) -> Path:
    return (settings or load_settings()).home / "notebooks"


def discover(folder: str | Path | None = None, only: Sequence[str] | None = None) -> list[Path]:
    """The numbered notebooks of `folder`, in order; `only` keeps the given numbers ("02", "2")."""
    folder = Path(folder) if folder is not None else notebooks_dir()
    found = sorted(p for p in folder.glob("*.ipynb") if NOTEBOOK_NAME.match(p.name))
    if only:
        wanted = {f"{int(n):02d}" for n in only}
        found = [p for p in found if number(p) in wanted]
    return found


def number(path: Path) -> str:
    match = NOTEBOOK_NAME.match(path.name)
    if match is None:
        raise ValueError(f"{path.name} is not a numbered notebook (NN_name.ipynb)")
    return match.group(1)


def unique_prefix(path: Path) -> str:
    """nb-<NN>-<6 hex>: a valid index prefix no other run uses."""
    return f"nb-{number(path)}-{secrets.token_hex(3)}"


@dataclass
class RunResult:
    notebook: Path
    output: Path
    prefix: str
    seconds: float
    #: "cell 7 (`recall(...)`): NameError: ..." when the notebook failed.
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _cell_error(exc: Exception) -> str:
    """Where and why a papermill run failed, in one line."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        first = next((line.strip() for line in (exc.source or "").splitlines() if line.strip()), "")
        where = f"cell {exc.cell_index + 1} (In [{exc.exec_count}]" + (f": `{first[:60]}`)" if first else ")")
        return f"{where}: {exc.ename}: {exc.evalue}"
    return f"{type(exc).__name__}: {exc}"


def _drop_prefix(prefix: str) -> None:
    """Best-effort cleanup of a failed notebook's indices (it never reached its cleanup cell)."""
    from elasticsearch import ApiError, TransportError

    from atlas.core.errors import AtlasError
    from atlas.core.schemas import drop_indices
    from atlas.security.connection import connect

    try:
        drop_indices(connect(), prefix)
    except (AtlasError, ApiError, TransportError):
        pass


def run_notebook(path: str | Path, out_dir: str | Path, *, outputs_dir: str | Path, prefix: str | None = None,
                 parameters: dict | None = None, kernel: str = KERNEL, timeout: float | None = 1800) -> RunResult:
    """Execute one notebook into `out_dir/<name>` with a fresh `INDEX_PREFIX`; never raises on a cell error.

    The kernel runs in the notebook's folder and inherits this process's environment, with
    `ATLAS_HOME` set to this checkout unless it is set already.
    """
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillException

    path = Path(path).resolve()
    # The kernel inherits the environment: pin the checkout, whatever folder the notebook sits in.
    os.environ.setdefault("ATLAS_HOME", str(load_settings().home))
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / path.name
    prefix = prefix or unique_prefix(path)
    params = {"INDEX_PREFIX": prefix, "OUT_DIR": str(Path(outputs_dir).resolve()), **(parameters or {})}
    started = time.perf_counter()
    error = None
    try:
        papermill.execute_notebook(str(path), str(output), parameters=params, kernel_name=kernel,
                                   cwd=str(path.parent), progress_bar=False, log_output=False,
                                   execution_timeout=timeout)
    except (PapermillException, CellTimeoutError, DeadKernelError, RuntimeError) as exc:
        error = _cell_error(exc)
        _drop_prefix(prefix)
    return RunResult(path, output, prefix, time.perf_counter() - started, error)


def run_all(out_dir: str | Path, *, outputs_dir: str | Path, notebooks: Sequence[Path] | None = None,
            echo: Callable[[str], None] = print) -> list[RunResult]:
    """Run the notebooks in order, one progress line each; stop at the first failure."""
    notebooks = list(notebooks if notebooks is not None else discover())
    results: list[RunResult] = []
    width = max((len(p.stem) for p in notebooks), default=0)
    for i, path in enumerate(notebooks, start=1):
        result = run_notebook(path, out_dir, outputs_dir=outputs_dir)
        results.append(result)
        status = "ok" if result.ok else "FAILED"
        echo(f"[{i}/{len(notebooks)}] {path.stem:<{width}}  {status:<6} {result.seconds:6.1f} s")
        if not result.ok:
            echo(f"{path.name} failed: {result.error}")
            echo(f"  executed notebook with the traceback: {result.output}")
            break
    return results


# --- run times -------------------------------------------------------------------------------

#: Each notebook's measured cold and warm wall time (`atlas notebooks times`), which its opening states.
TIMES_FILE = "times.json"


def measure_times(notebooks: Sequence[Path], work_dir: str | Path, *, echo: Callable[[str], None] = print) -> dict:
    """Run each notebook twice: cold, with an empty embedding cache of its own (as on the first run after
    `make setup`), then warm, with what that run cached. Both runs write into `work_dir`, a fresh outputs folder,
    so that no earlier saved result stands in for the cold run's work (notebook 13's warm run loads the benchmark
    its cold run saved, as a second run in a workshop does). A failure raises."""
    work_dir = Path(work_dir).resolve()
    measured: dict[str, dict] = {}
    saved = os.environ.get("ATLAS_EMBEDDING_CACHE")
    try:
        for path in notebooks:
            os.environ["ATLAS_EMBEDDING_CACHE"] = str(work_dir / "cache" / path.stem)
            load = os.getloadavg()[0]
            runs = {}
            for state in ("cold", "warm"):
                result = run_notebook(path, work_dir / state, outputs_dir=work_dir / "outputs")
                if not result.ok:
                    raise RuntimeError(f"{path.name} failed ({state}): {result.error}")
                runs[f"{state}_s"] = round(result.seconds, 1)
            measured[path.stem] = {**runs, "loadavg": round(load, 1)}
            echo(f"{path.stem}: cold {duration_words(runs['cold_s'])}, warm {duration_words(runs['warm_s'])} "
                 f"(load average {load:.1f})")
    finally:
        if saved is None:
            os.environ.pop("ATLAS_EMBEDDING_CACHE", None)
        else:
            os.environ["ATLAS_EMBEDDING_CACHE"] = saved
    return measured


def duration_words(seconds: float) -> str:
    """A run time as an opening says it: "15 s" (to 5 s), "2 min" or "2.5 min" (to half a minute)."""
    if seconds < 57.5:
        return f"{max(5, 5 * round(seconds / 5))} s"
    minutes = round(seconds / 30) / 2
    return f"{minutes:g} min"


def how_long(times: dict) -> str:
    """The sentence a notebook's opening starts its **How long:** with, from its entry in `TIMES_FILE`."""
    return (f"**How long:** {duration_words(times['warm_s'])} with warm caches, {duration_words(times['cold_s'])} "
            f"cold (an empty embedding cache, as on the first run after `make setup`), measured by `atlas notebooks "
            f"times` on a 2-core machine at a load average of {times['loadavg']:g}.")


# --- summary --------------------------------------------------------------------------------


def _numbers(data: object) -> dict[str, float]:
    """Top-level numeric entries of a metrics JSON object."""
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def summary(outputs_dir: str | Path) -> str:
    """What a run left in `outputs_dir`: figures, metrics JSON files (top-level numbers), executed notebooks."""
    root = Path(outputs_dir)
    lines = [f"outputs in {root}"]
    figures = sorted(root.glob("**/*.png"))
    lines.append(f"figures ({len(figures)}):")
    lines += [f"  {p.relative_to(root)}  {p.stat().st_size / 1024:.0f} kB" for p in figures]
    metrics = sorted(p for p in root.glob("**/*.json") if ".ipynb_checkpoints" not in p.parts)
    lines.append(f"metrics ({len(metrics)}):")
    for path in metrics:
        try:
            numbers = _numbers(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            lines.append(f"  {path.relative_to(root)}  unreadable: {exc}")
            continue
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())
        lines.append(f"  {path.relative_to(root)}" + (f"  {shown}" if shown else ""))
    executed = sorted(p for p in root.glob("**/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    lines.append(f"executed notebooks ({len(executed)}):")
    for path in executed:
        try:
            meta = json.loads(path.read_text()).get("metadata", {}).get("papermill", {})
        except (OSError, ValueError):
            meta = {}
        state = "failed" if meta.get("exception") else "ok"
        took = f"{meta['duration']:.1f} s" if isinstance(meta.get("duration"), (int, float)) else "?"
        lines.append(f"  {path.relative_to(root)}  {state}  {took}")
    return "\n".join(lines)

