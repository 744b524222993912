"""Runs the plugin's Lua unit tests (editors/nvim/tests/*_spec.lua) in headless Neovim (0.7+)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from .nvim_driver import PLUGIN, ROOT


@pytest.mark.skipif(shutil.which("nvim") is None, reason="nvim is not installed (apt-get install -y neovim)")
def test_lua_unit_tests_pass():
    r = subprocess.run(["nvim", "--headless", "-u", "NONE", "-i", "NONE", "--cmd", f"set rtp^={PLUGIN}",
                        "-c", f"luafile {PLUGIN / 'tests' / 'run.lua'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    m = re.search(r"(\d+) passed, (\d+) failed", out)
    assert m, out
    assert r.returncode == 0 and m.group(2) == "0", out
    assert int(m.group(1)) >= 10, out
