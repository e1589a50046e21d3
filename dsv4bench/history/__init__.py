"""The run history: entries of runs (store), regressions against the rolling history (trend),
trend figures (figures), the static trend page (page), the PyTorch OSS benchmark database's v3
records (export)."""
