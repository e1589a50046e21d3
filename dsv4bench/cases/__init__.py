"""Cases: one point of a sweep and what it needs to be judged. `case` holds the Case (sizes, op,
layout, tolerance) and the axis vocabularies; `inputs` makes its seeded tensors as engines lay
them out; `oracle` computes the expected answer with `reference/`; `indexer_case` sizes the
indexer op. Imports `reference/` and `rows`, never the runner, backends' kernels or reports."""
