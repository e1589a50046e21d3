"""The slow float64 reference now ships as dsv4bench/backends/slow_f64.py (the reference-f64
backend uses it); the oracle's tests import it from here."""

from dsv4bench.backends.slow_f64 import slow_decode, slow_prefill

__all__ = ["slow_decode", "slow_prefill"]
