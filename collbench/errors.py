"""Errors a user can fix. They print one clear line and exit with code 2."""


class UserError(Exception):
    """Bad input: a config key, a flag value, a missing file. Exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """The configuration file (or a flag overriding it) is invalid."""

    def __init__(self, source, key, message):
        self.source = source
        self.key = key
        where = f"{source}: " if source else ""
        keypart = f"{key}: " if key else ""
        super().__init__(f"{where}{keypart}{message}")
