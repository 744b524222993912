"""Terminal capture of ghost text in a real (non-headless) Neovim under tmux, for editors/README.md.

    python tests/editors/capture_ghost.py [--model DIR] [--keys 'Go    def mean(xs):<CR>']

Starts nvim with the e2e init in a 90x16 tmux pane, types, waits for the ghost text and prints the pane
(tmux capture-pane). Ghost text is drawn in the Comment highlight; the plain capture shows it as text after the
cursor, and the plugin's own view of it is printed below the pane.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

SOURCE = '''import statistics


def mean(xs):
    """Arithmetic mean of a non-empty list."""
    return sum(xs) / len(xs)


'''


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model dir (default: engine/models/default, else a tiny random one)")
    ap.add_argument("--keys", default="Godef median(xs):<CR>", help="tmux send-keys text typed after the file opens")
    ap.add_argument("--settings", default='{"debounceMs": 0, "maxTokens": 48}')
    args = ap.parse_args()
    if not shutil.which("tmux") or not shutil.which("nvim"):
        print("needs tmux and nvim", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kogcap"))
    model = args.model
    if model is None:
        default = ROOT / "engine" / "models" / "default"
        if (default / "config.json").exists():
            model = str(default)
        else:
            sys.path.insert(0, str(ROOT))
            from engine.testing import make_tiny_checkpoint

            model = str(make_tiny_checkpoint(work / "tiny"))
    (work / "stats.py").write_text(SOURCE)
    cmd = [sys.executable, "-m", "kog_lsp", "--stdio", "--model", model, "--device", "cpu",
           "--log-file", str(work / "server.log")]
    env = {"KOG_NVIM_PLUGIN": str(ROOT / "editors" / "nvim"), "KOG_E2E_CMD": json.dumps(cmd),
           "KOG_E2E_SETTINGS": args.settings, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    sock = str(work / "sock")
    session = f"kogcap{os.getpid()}"
    launcher = work / "run.sh"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    launcher.write_text(f"cd {shlex.quote(str(work))}\n{exports}"
                        f"exec nvim --listen {shlex.quote(sock)} -i NONE -u {shlex.quote(str(HERE / 'nvim_e2e_init.lua'))} stats.py\n")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "90", "-y", "16", f"bash {launcher}"], check=True)

    def probe(call: str):
        r = subprocess.run(["nvim", "--server", sock, "--remote-expr", f'luaeval("KogE2E.{call}")'],
                           capture_output=True, timeout=30)
        return json.loads((r.stdout + r.stderr).decode() or "null")

    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if os.path.exists(sock) and probe("status()")["state"] == "ready":
                break
            time.sleep(0.5)
        subprocess.run(["tmux", "send-keys", "-t", session, *split_keys(args.keys)], check=True)
        g = None
        deadline = time.time() + 60
        while time.time() < deadline:
            g = probe("ghost()")
            if g["extmarks"]:
                break
            time.sleep(0.2)
        time.sleep(0.3)
        pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
        print(pane.rstrip("\n"))
        print("---- ghost text (kog.ghost.current):")
        print(json.dumps(g and g["current"], ensure_ascii=False))
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def split_keys(keys: str) -> list[str]:
    """'Godef f(<CR>' -> ['Godef f(', 'Enter'] for tmux send-keys."""
    out, buf = [], ""
    names = {"<CR>": "Enter", "<Esc>": "Escape", "<Tab>": "Tab", "<C-u>": "C-u", "<BS>": "BSpace"}
    i = 0
    while i < len(keys):
        for k, v in names.items():
            if keys.startswith(k, i):
                if buf:
                    out.append(buf)
                    buf = ""
                out.append(v)
                i += len(k)
                break
        else:
            buf += keys[i]
            i += 1
    if buf:
        out.append(buf)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
