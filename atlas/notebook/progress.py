"""Progress bars for a notebook's long cells: shown in a live frontend, never written into an executed notebook."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from IPython.display import clear_output

from atlas.notebook.inspector import interactive_frontend


@contextmanager
def transient_progress() -> Iterator[bool]:
    """Whether a long block should draw progress bars (pass it as `progress=`), and their clean-up.

    In a live frontend (JupyterLab, VS Code) the bars are drawn while the block runs and cleared from the cell when
    it ends; what the cell prints after the block stays. Under papermill or nbval there is no frontend to watch
    them, and nbval cannot clear an output, so no bar is drawn: the executed notebook never holds one, whatever the
    embedding cache held. Anything printed inside the block is cleared with the bars.
    """
    live = interactive_frontend()
    yield live
    if live:
        clear_output()
