"""Sending the journal's serializer registry to Spark's Python workers.

Spark pickles what a task runs with cloudpickle: classes and functions of modules that the workers can import
go by name, the others by value. A registry holds the user's types, ``to_dict``/``from_dict`` functions,
upcasters, serializers and key store; the modules that define them are often not importable on the workers
(a script's sibling module, a test module: the worker's ``sys.path`` is not the driver's). So while Spark
pickles a registry, :func:`shipped` has cloudpickle send those modules' objects by value: the modules that
belong to no installed distribution and are not the standard library's. Installed packages (pgjournal itself,
your application when it is installed on the workers) still go by name.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any

from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.errors import ConfigurationError


def _cloudpickle() -> Any:
    from pyspark import cloudpickle

    return cloudpickle


def _referenced_modules(obj: Any) -> set[str]:
    """The modules of every class and function that pickling ``obj`` meets."""
    cloudpickle = _cloudpickle()
    modules: set[str] = set()

    class Recorder(cloudpickle.Pickler):  # type: ignore[misc,name-defined]
        def reducer_override(self, item: Any) -> Any:
            if isinstance(item, type) or (callable(item) and hasattr(item, "__code__")):
                module = getattr(item, "__module__", None)
                if isinstance(module, str):
                    modules.add(module)
            return super().reducer_override(item)

    Recorder(io.BytesIO()).dump(obj)
    return modules


def local_modules(obj: Any) -> list[str]:
    """The modules of ``obj``'s classes and functions that Spark's workers may not import: in no installed
    distribution, not the standard library's, not ``__main__`` (which cloudpickle sends by value anyway)."""
    from importlib.metadata import packages_distributions

    installed = packages_distributions()
    return sorted(m for m in _referenced_modules(obj)
                  if m in sys.modules and m != "__main__" and m.partition(".")[0] not in installed
                  and m.partition(".")[0] not in sys.stdlib_module_names and m not in sys.builtin_module_names)


@contextlib.contextmanager
def shipped(registry: SerializerRegistry | None, what: str) -> Iterator[None]:
    """While Spark pickles ``registry`` (inside ``what``), its local modules go by value. Raises
    :class:`ConfigurationError` when the registry cannot be pickled at all."""
    if registry is None:
        yield
        return
    if not isinstance(registry, SerializerRegistry):
        raise ConfigurationError(f"serializers must be a pgjournal SerializerRegistry, got {type(registry).__name__}")
    cloudpickle = _cloudpickle()
    try:
        modules = local_modules(registry)
    except Exception as exc:
        raise ConfigurationError(
            f"the serializer registry cannot be sent to Spark's workers: pickling it failed ({type(exc).__name__}: "
            f"{exc}); its types, functions, serializers and key store must be picklable by cloudpickle") from None
    added = [m for m in modules if m not in cloudpickle.list_registry_pickle_by_value()]
    for name in added:
        cloudpickle.register_pickle_by_value(sys.modules[name])
    try:
        yield
    except Exception as exc:
        if "pickl" in f"{type(exc).__name__} {exc}".lower():
            raise ConfigurationError(f"{what} could not pickle the serializer registry for Spark's workers: "
                                     f"{type(exc).__name__}: {exc}") from None
        raise
    finally:
        for name in added:
            with contextlib.suppress(Exception):
                cloudpickle.unregister_pickle_by_value(sys.modules[name])
