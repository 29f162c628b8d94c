"""Binding a backend's options: what its hooks get as ``options``.

The options dataclass its ``configure`` hook declares (typed, checked, each
refusal a ConfigError naming the option where the user wrote it), or the mapping
as given to a backend that declares none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hetero_dp.model.errors import ConfigError
from hetero_dp.model.options import parse_options, schema_of

if TYPE_CHECKING:
    from hetero_dp.engine.config import Config


class OptionBinder:
    """One backend's options schema, and how options reach it from a config."""

    def __init__(self, name: str, configure: Any) -> None:
        self.name = name
        self.takes_options = configure is not None
        self.schema = schema_of(configure)

    def read(
        self,
        options: Mapping[str, Any],
        *,
        source: str = "",
        flagged: frozenset[str] = frozenset(),
    ) -> Any:
        """An instance of the options dataclass (checked: ConfigError naming the
        option), or the mapping as given. Options for a backend with no ``configure``
        hook are refused: nothing would read them."""
        field = f"backends.{self.name}"
        if self.schema is not None:
            return parse_options(
                self.schema, options, field=field, source=source or "config", flagged=flagged
            )
        if options and not self.takes_options:
            raise ConfigError(
                f"unknown key: backend {self.name!r} takes no options (it has no configure hook)",
                field=f"{field}.{next(iter(options))}",
                source=source or "config",
            )
        return options

    def read_from(self, cfg: Config) -> Any:
        """:meth:`read` with this backend's options from ``cfg`` (the file, the
        environment and ``-o`` flags); a refusal names the option where the user
        wrote it."""
        try:
            return self.read(
                cfg.backend_options(self.name),
                source=cfg.options_source(self.name),
                flagged=cfg.backend_flagged.get(self.name, frozenset()),
            )
        except ConfigError as e:
            where = cfg.option_field(self.name, e.field or "")
            given = e.source == cfg.options_source(self.name)  # not an env var's, say
            source = source_of(cfg, self.name, where) if given else e.source
            if (where, source) == (e.field, e.source):
                raise
            raise ConfigError(e.reason, field=where, source=source) from None


# What a backend's own check may give as the source of a refusal of its options when it
# cannot know the file ("config", or nothing): the framework names the place itself.
UNPLACED = ("", "config")


def placed(name: str, e: ConfigError, cfg: Config) -> ConfigError:
    """A backend's refusal of its options, named where the user wrote the option.

    A ``configure`` hook knows its options, not where they came from: its ConfigError
    names the option relative to its own options (``plugin.deviceListStrategy``) with
    no source (or ``config``). Here that becomes the file (or ``-o`` flag) and the
    field as written (``flags.plugin.deviceListStrategy`` for a section the backend claims,
    ``backends.<name>.<key>`` otherwise). A refusal that names its own source (an
    environment variable, the command line) is left as it is.
    """
    if e.source not in UNPLACED:
        return e
    field = e.field
    prefix = f"backends.{name}"
    if field and not field.startswith(prefix + ".") and field != prefix:
        field = f"{prefix}.{field}"
    field = cfg.option_field(name, field) if field else ""
    return ConfigError(e.reason, field=field, source=source_of(cfg, name, field))


def source_of(cfg: Config, name: str, field: str) -> str:
    """Where the option at ``field`` (as written) was given: the ``-o`` flag that set
    it, or else the config (file, inline, defaults)."""
    prefix = f"backends.{name}."
    source = cfg.options_source(name)
    if field.startswith(prefix):
        key = field[len(prefix) :].split("[", 1)[0]
        if key in cfg.backend_flagged.get(name, frozenset()):
            return f"flag -o {name}.{key}"
        if source.startswith("flag -o "):
            return cfg.source
    return source


def configure_error(name: str, e: Exception) -> ConfigError:
    """A refusal (ConfigError, ValueError) or failure of ``configure`` or
    ``parse_args`` as a ConfigError naming the backend (unless it names its own
    source)."""
    if isinstance(e, ConfigError):
        return ConfigError(e.reason, field=e.field, source=e.source or f"backend {name}")
    return ConfigError(str(e), source=f"backend {name}")
