"""How the runtime's messages reach Python: logging.getLogger("opjit").

The runtime logs warnings a user must see (a cache that cannot be written,
so every process compiles again; an optimizing compile that failed), and,
when asked, what it does (INFO: each load) and each call's kernel (DEBUG).
They go to the logger "opjit" with the matching level; with logging left
unconfigured Python prints WARNING and above on stderr, like the opjit
command. A runtime asks the library for the messages that logger would
show when the runtime is made (the default runtime: at the first load), so
set its level before: logging.getLogger("opjit").setLevel(logging.INFO).

Nothing here imports logging until there is a message to log or logging is
already imported: importing opjit stays cheap.
"""
import atexit as _atexit
import sys as _sys

from . import _opjit

# opjit's levels (OPJIT_LOG_ERROR..DEBUG) as logging's.
_LEVELS = (40, 30, 20, 10)


# Said by Runtime() already, as a warnings.warn naming the directory.
_WARNED_BY_RUNTIME = "the configured ops path names "


def _emit(level, text):
    if text.startswith(_WARNED_BY_RUNTIME):
        return
    import logging
    logger = logging.getLogger("opjit")
    py_level = _LEVELS[level] if 0 <= level < len(_LEVELS) else 10
    if logger.isEnabledFor(py_level):
        logger.log(py_level, "%s", text)


def _verbosity():
    logging = _sys.modules.get("logging")
    if logging is None:  # nobody configured logging: its default, WARNING
        return 1
    level = logging.getLogger("opjit").getEffectiveLevel()
    return 3 if level <= 10 else 2 if level <= 20 else 1 if level <= 30 else 0


_opjit._set_log_hooks(_emit, _verbosity)
# Registered before the package's own exit handler (which destroys the
# default runtime), so it runs after it: what that logs is delivered too.
_atexit.register(_opjit._log_close)
