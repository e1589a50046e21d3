"""A float64 reference for the CPU: its own FP8 byte parser (parse.py) and the backend
(backend.py), sharing no code with reference/."""
