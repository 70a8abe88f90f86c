"""`python -m sentemb`: one screen listing every command, printed without importing the heavy libraries."""

from __future__ import annotations

import subprocess
import sys

from sentemb.common.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "sentemb"
# every `python -m sentemb.<command>`: a top-level module, not the package's own files or the exported folders' module
COMMANDS = sorted({p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__", "st_modules"})


def test_python_m_sentemb_lists_every_command_on_one_screen():
    result = subprocess.run([sys.executable, "-m", "sentemb"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(COMMANDS) == 10 and len(lines) <= 24, "one screen"
    for command in COMMANDS:
        assert any(line.strip().startswith(f"python -m sentemb.{command} ") for line in lines), command


def test_python_m_sentemb_imports_no_heavy_library():
    code = (
        "import runpy, sys\n"
        "try:\n    runpy.run_module('sentemb', run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = {'torch', 'lightning', 'hydra', 'transformers', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
