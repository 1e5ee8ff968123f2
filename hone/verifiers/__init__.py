"""Verifiers: checks of a response that know nothing of rollouts, recipes or registries.

`math` extracts a final answer and compares it with a reference, `sandbox` runs untrusted programs
(the code reward's tests, the `python` tool), `budget` says how long a check may take inside a scored
reward call. A leaf package: `rewards` wraps these as named rewards, `envs` and `data` tasks call them
directly, and none of those import each other (DESIGN.md "Packages").
"""
