"""minibp.data moved to minibp.io.data (from minibp.io import data). This old name keeps working for one release:
importing it warns (DeprecationWarning) and gives minibp.io.data itself."""
import sys
import warnings

from .io import data

warnings.warn("minibp.data is now minibp.io.data (from minibp.io import data); the old name goes in a later release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = data
