"""Rewards as a service: the reward server, its job store, its backends and its adapters.

`kernelrl.serve.server` turns HTTP requests into evaluator calls, `jobs` persists every accepted
job in SQLite, `dispatch` hands jobs to a backend (`lanes`: in-process evaluators, one per device;
`ray_backend`: one Ray actor per device), `client` is the Python client, and `verl` is verl's
custom reward. See README.md in this folder.

Nothing is imported here, so `import kernelrl.backends.client` does not pull in FastAPI or Ray.
"""
