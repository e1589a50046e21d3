"""The slow float64 reference now ships as dsv4bench/backends/f64/parse.py (the reference-f64
backend uses it); tests import it from here under its old name."""

from dsv4bench.backends.f64.parse import *  # noqa: F403
