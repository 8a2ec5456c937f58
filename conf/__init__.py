"""The `conf/` folder, shipped as the package `stack.conf` (Hydra: pkg://stack.conf).

Importing it registers the dataclass schemas and resolvers, so the Compose API works on its own.
"""

from stack.config.schema import register

register()
