"""What start-up builds (modules, classes, mitmproxy, the tokenizer) kept out of the cyclic garbage
collector's passes.

A proxy process holds ~130 k tracked objects from its imports, none of them garbage. CPython's collector
walks them all at each full pass: 0.1-0.2 s with the event loop stopped, a stall for every call in flight
(docs/benchmarks-history.md). `settle` moves every object alive at that moment into the
collector's permanent generation (`gc.freeze`, O(1)); the objects stay alive and freed by their reference
counts as before, only a cycle among them is no longer found. It is called where a large import has just
finished: mitmproxy serving (capture/mitm.py), a tokenizer loaded in the background (render/renderer.py),
and `record`'s start-up, run with the collector paused (capture/early.py).
"""

from __future__ import annotations

import gc
import os


def settle() -> None:
    """Freeze what is alive now (see the module's doc). POLARPROXY_GC_FREEZE=0 turns it off."""
    if os.environ.get("POLARPROXY_GC_FREEZE", "1") != "0":
        gc.freeze()
