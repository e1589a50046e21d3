"""Cases: one point of a sweep and what it needs to be judged. `case` holds the Case (sizes, op,
layout, tolerance) and the axis vocabularies; `inputs` makes its seeded tensors as engines lay
them out (`tensors`: the building blocks, caches written in the layout the Case names);
`oracle` computes the expected answer with `reference/`; `indexer_case` sizes the indexer op.
Imports `reference/` and `rows`, never the runner, backends' kernels or reports."""
