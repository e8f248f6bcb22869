"""The model registry: the one owner of the server's models.

* `specs` - what a name means (`resolve`, `find_spec`: one pass through
  models/store/discovery.py), as a `ModelSpec`;
* `core` - `ModelRegistry`: loads into the engine or a queue, start-up
  loads and their errors, holds, keep_alive, LRU eviction, unloads;
* `keeping` - eviction, unloads and the reaper, for `core`;
* `views` - the loaded models by kind and id, reports and stats;
* `opening` - opening a backend with its resolved options (blocking);
* `records` - what is kept per model.

Every route, command and worker reaches models through a `ModelRegistry`
(the serving layer's `ModelHost` holds one).
"""

from localserve.models.registry.core import ModelRegistry
from localserve.models.registry.records import LoadedModel, LoadedOneShot, ModelHold, ModelRecord
from localserve.models.registry.specs import ModelSpec, find_spec, resolve, spec_of

__all__ = [
    "ModelHold",
    "LoadedModel",
    "LoadedOneShot",
    "ModelRecord",
    "ModelRegistry",
    "ModelSpec",
    "find_spec",
    "resolve",
    "spec_of",
]
