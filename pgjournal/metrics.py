"""Deprecated alias of :mod:`pgjournal.runtime.metrics`, kept for one release: import that module instead."""

import sys
import warnings

from pgjournal.runtime import metrics as _moved

warnings.warn(f"{__name__} moved to pgjournal.runtime.metrics; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
