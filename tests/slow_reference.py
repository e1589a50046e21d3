"""The slow float64 reference now ships as dsv4bench/backends/slow_f64.py (the reference-f64
backend uses it); tests import it from here under its old name."""

from dsv4bench.backends.slow_f64 import *  # noqa: F403
