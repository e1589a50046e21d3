"""The kernel builds engines ship: which package members make which build (catalog), the
kernels folder and its manifest (store), fetch, pack/unpack, and the backend instances."""
