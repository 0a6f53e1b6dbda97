"""The leak measurement the C map's leak tests share (tests/test_implementations.py,
tests/test_user_code_errors.py): a cycle run once to warm caches, once under
``tracemalloc``, then ``cycles`` times more; what the traced memory grew by.
The caller also compares the reference counts of the objects the cycle touched.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def traced_growth(cycle: Callable[[], None], cycles: int) -> int:
    """Bytes of traced memory ``cycles`` runs of ``cycle`` leave behind."""
    cycle()
    gc.collect()
    tracemalloc.start()
    try:
        cycle()
        gc.collect()
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(cycles):
            cycle()
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return end - start
