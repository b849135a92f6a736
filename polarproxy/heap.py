"""What start-up builds (modules, classes, mitmproxy, the tokenizer) kept out of the cyclic garbage
collector's passes.

A proxy process holds ~0.5 M objects from its imports, none of them garbage. CPython's collector walks
them all at each full pass: ~0.2 s with the event loop stopped, a stall in every call in flight
(docs/benchmarks.md, issue 12's eleventh round). `settle` moves every object alive at that moment into
the collector's permanent generation (`gc.freeze`, O(1)); the objects stay alive and freed by their
reference counts as before, only a cycle among them is no longer found. It is called where a large
import has just finished: mitmproxy serving (capture/mitm.py) and a tokenizer loaded (render/renderer.py).
"""

from __future__ import annotations

import gc
import os


def settle() -> None:
    """Freeze what is alive now (see the module's doc). POLARPROXY_GC_FREEZE=0 turns it off."""
    if os.environ.get("POLARPROXY_GC_FREEZE", "1") != "0":
        gc.freeze()
