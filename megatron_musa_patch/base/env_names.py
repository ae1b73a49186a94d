"""The names of the layer's environment variables, for the modules that set or name one (each is
described, read and checked in ``settings.py``). Below every other module: the release checks
name them in their messages too."""

PREFIX = "MEGATRON_MUSA_PATCH"
ACTIVATE_ENV = PREFIX
AUTOACTIVATE_ENV = f"{PREFIX}_AUTOACTIVATE"
DEVICE_ENV = f"{PREFIX}_DEVICE"
DISABLE_ENV = f"{PREFIX}_DISABLE"
ALLOW_LATE_ENV = f"{PREFIX}_ALLOW_LATE"
ALLOW_UNVERIFIED_ENV = f"{PREFIX}_ALLOW_UNVERIFIED"
TORCHADA_ENV = f"{PREFIX}_TORCHADA"
LOG_ENV = f"{PREFIX}_LOG"
ARGS_CHECK_ENV = f"{PREFIX}_ARGS_CHECK"
WATCHDOG_DIR_ENV = f"{PREFIX}_WATCHDOG_DIR"
