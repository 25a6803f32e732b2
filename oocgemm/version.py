"""The package's version (a leaf: what reports it needs import nothing else), and when the
deprecated names go."""

import warnings

__version__ = "0.1.0"

#: The version from which the deprecated module names (``oocgemm.hints``, ``hostinfo``,
#: ``sysinfo``, ``testing``, ``cuda.engine``) are gone; each warns with it on import, and a
#: test fails once ``__version__`` reaches it while they are still there.
OLD_NAMES_REMOVED_IN = "0.3.0"


def renamed(old: str, new: str) -> None:
    """Warn, on import of the deprecated module ``old``, that it is ``new`` now."""
    warnings.warn(f"{old} is {new} now; import it from there (the old name goes in oocgemm "
                  f"{OLD_NAMES_REMOVED_IN})", DeprecationWarning, stacklevel=3)
