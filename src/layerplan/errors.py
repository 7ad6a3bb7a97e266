"""The exception family for bad input. The CLI catches ``LayerplanError`` once and prints a
single line (exit code 2); everything else is a bug and keeps its traceback."""


class LayerplanError(Exception):
    """Bad input from a person: a message that says what is wrong and, where it helps, what to do."""


class UnitError(LayerplanError):
    """A quantity with a missing or unknown unit ("10 Gbit" is fine, "10 Gbat" is not)."""


class SpecError(LayerplanError):
    """A malformed NetSpec, cluster file, plan file, or a value out of range in a spec."""


class ModelError(LayerplanError):
    """A model that cannot be found, built or analysed."""


class ConfigError(LayerplanError):
    """A strategy configuration that does not apply to this network or cluster (and why)."""
