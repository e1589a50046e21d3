"""The command line's jobs, one module each: plan, run (run and bench), merge, and the commands
that read results (report, compare, backends, env); `common` holds what they share. cli.py
builds the parser and calls them. May import every stage; no stage imports this package."""
