"""`make test-slow` executes the notebooks top to bottom (each starts its own small runs)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from sentemb.common.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow
NOTEBOOKS = PROJECT_ROOT / "notebooks"


# paradigm_analysis: Figures 2-4 and the telemetry panel; results: the STS bars and one sweep scatter (τ)
@pytest.mark.parametrize(("name", "figures"), [("paradigm_analysis.ipynb", 4), ("results.ipynb", 2)])
def test_notebook_runs_top_to_bottom(name, figures, monkeypatch):
    for variable in ("RUN_DIR", "RESULTS_ROOT"):  # the notebooks make their own small runs
        monkeypatch.delenv(variable, raising=False)
    # the kernel gets Jupyter's inline backend, as a user's does, not the file-only one conftest's configure_process
    # sets for this process (under it plt.show() displays nothing)
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(PROJECT_ROOT)}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs) == figures
