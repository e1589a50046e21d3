"""The figures tools/readme_numbers.py checks, by study: NAME -> a function of the committed
rows returning the figure's text."""

from __future__ import annotations

from collections.abc import Callable

from . import attention, baseline, builds, dsa, q8kv8, topk

MODULES = (q8kv8, dsa, baseline, topk, attention, builds)

FIGURES: dict[str, Callable[[], str]] = {}
for _module in MODULES:
    if _twice := FIGURES.keys() & _module.FIGURES.keys():
        raise ValueError(f"figures named in two modules: {sorted(_twice)}")
    FIGURES.update(_module.FIGURES)
