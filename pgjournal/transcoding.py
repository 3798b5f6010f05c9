"""Deprecated alias of :mod:`pgjournal.codec.transcoding`, kept for one release: import that module instead."""

import sys
import warnings

from pgjournal.codec import transcoding as _moved

warnings.warn(f"{__name__} moved to pgjournal.codec.transcoding; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
