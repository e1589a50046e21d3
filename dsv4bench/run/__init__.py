"""Running: jobs (case x backend instance) through isolated worker processes. `runner` owns the
job list, the worker pool, timeouts, crash capture, resume and limit searches; `worker` runs one
job in a child process; `devices` pins workers to GPUs; `shard` splits a run; `merge` joins
shards. May import every stage but `report`."""
