"""Every played episode, stored with its tokens and numbers (``RUN_DIR/rollouts/``), and read back.

>>> import agentrl.rollouts
>>> table = agentrl.rollouts.load("runs/calculator-...")   # a pyarrow.Table; .to_pandas() for pandas

The schema is :mod:`agentrl.rollouts.schema`; writing and the crash guarantees :mod:`agentrl.rollouts.store`;
turning episodes into rows :mod:`agentrl.rollouts.rows`.
"""

from agentrl.rollouts.errors import RolloutSchemaError, RolloutStoreError
from agentrl.rollouts.schema import EPISODE_COLUMNS, SCHEMA, SCHEMA_VERSION, TOKEN_COLUMNS
from agentrl.rollouts.store import RolloutWriter, StoreFile, list_files, load, read_file

__all__ = [
    "EPISODE_COLUMNS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "TOKEN_COLUMNS",
    "RolloutSchemaError",
    "RolloutStoreError",
    "RolloutWriter",
    "StoreFile",
    "list_files",
    "load",
    "read_file",
]
