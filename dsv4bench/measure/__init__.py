"""Measuring: how a call is timed (`timing`), how an answer is judged and what is derived from
it (`metrics`, `topk`, `invariance`), and what the GPU can do (`hardware`). Imports `cases` and
`rows`, never the runner or the report."""
