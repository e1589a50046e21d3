"""Measuring: how a call is timed (`timing`), how an answer is judged (`judge`: the one verdict,
from `metrics` tolerances and `topk` picks) and what is derived from it (`metrics`,
`invariance`), and what the GPU can do (`hardware`). Imports `cases` and
`rows`, never the runner or the report."""
