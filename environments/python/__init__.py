"""The python environment: math and string problems solved by running Python in a sandbox (see env.py)."""

from agentrl.envs import register

register(
    "python-v0",
    "environments.python.env:PythonEnv",
    description="multi-turn, tools, sandbox: math and string problems solved with a run_python tool",
)
