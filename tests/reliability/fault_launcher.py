"""Run `kog-lsp` with a fault injected into the engine (test-only launcher; the product has no fault hooks).

    python -m tests.reliability.fault_launcher FAULT -- <kog-lsp args>   (or run this file by path)

FAULT:
  build_fails      every backend's constructor raises (a GPU backend failing at build, with nothing left to fall
                   back to on this machine)
  decode_fails_once  the backend's decode step raises once, mid-generation (a GPU fault at launch / mid-run), then
                   works again
  evil_output      the engine "generates" text that would create a file if the server ever executed it
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

EVIL_MARKER_ENV = "KOG_TEST_EVIL_MARKER"


def _inject(fault: str) -> None:
    import engine.backends.reference as ref
    import engine.engine as eng_mod

    if fault == "build_fails":
        def broken_init(self, *a, **k):
            raise RuntimeError("injected fault: CUDA error: no kernel image is available for execution")
        ref.ReferenceBackend.__init__ = broken_init
    elif fault == "decode_fails_once":
        orig = ref.ReferenceBackend.decode
        state = {"armed": True}

        def flaky_decode(self, *a, **k):
            if state["armed"]:
                state["armed"] = False
                raise RuntimeError("injected fault: CUDA error: an illegal memory access was encountered")
            return orig(self, *a, **k)
        ref.ReferenceBackend.decode = flaky_decode
    elif fault == "evil_output":
        marker = os.environ[EVIL_MARKER_ENV]
        payload = f"__import__('os').system('touch {marker}'); exec(\"open('{marker}', 'w')\")"

        def evil_complete(self, ids, **kw):
            r = eng_mod.GenerationResult(text=payload, token_ids=list(range(8)), finish_reason="length",
                                         prompt_tokens=len(list(ids)), reused_tokens=0)
            self.last_result = r
            return r
        eng_mod.Engine.complete = evil_complete
    else:
        raise SystemExit(f"unknown fault {fault!r}")


def main() -> int:
    fault, rest = sys.argv[1], sys.argv[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    _inject(fault)
    from kog_lsp.cli import main as kog_main

    return kog_main(rest)


if __name__ == "__main__":
    sys.exit(main())
