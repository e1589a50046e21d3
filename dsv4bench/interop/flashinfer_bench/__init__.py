"""flashinfer-bench (0.1.2): its TraceSet folder (definitions, workloads, solutions, traces).

schema.py   a Case as one of their Definitions: axes, inputs, outputs, the oracle as reference
export.py   a run folder -> a TraceSet folder
import_.py  their dsa_paged definitions and workloads -> a scenario of this suite
adapter.py  what the exported reference and solutions call: the oracle or a backend, in their
            outputs' form (lse base 2)
"""
