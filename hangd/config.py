"""One typed settings object, built at start (never at import) from, in order of precedence:
command-line flags, ``HANGD_*`` environment variables, a TOML file (``--config``,
``HANGD_CONFIG`` or ``/etc/hangd/hangd.toml`` when present), and the defaults here."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hangd.redact import redact_url, url_password

DEFAULT_PORT = 9877  # not taken by node_exporter (9100), dcgm-exporter (9400), Prometheus (9090)
DEFAULT_CONFIG = "/etc/hangd/hangd.toml"


class ConfigError(Exception):
    """A bad flag, value or file: the message names what is wrong."""


def check_db_url(url: str) -> None:
    """Refuse a database URL whose password holds a raw '@': SQLAlchemy ends the password at the
    first '@', takes the rest for the host, and the driver then prints that piece of the password
    in its "cannot resolve host" error."""
    pw = url_password(url)
    if pw and "@" in pw:
        raise ConfigError(f"db {redact_url(url)}: the password contains '@', which ends a password in a URL; "
                          "write it as %40 (URL-encode the password)")


def default_db_url() -> str:
    if os.geteuid() == 0:
        return "sqlite:////var/lib/hangd/hangd.db"
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return f"sqlite:///{os.path.join(base, 'hangd', 'hangd.db')}"


@dataclass
class Settings:
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    db: str = field(default_factory=default_db_url)
    interval: float = 1.0  # seconds between samples
    token: str | None = None
    token_file: str | None = None
    proc_root: str = "/proc"
    job_env: list[str] = field(default_factory=lambda: ["MASTER_ADDR", "TORCHELASTIC_RUN_ID"])
    nvml: bool = True
    stacks: bool = True
    pyspy_timeout: float = 5.0
    retention_days: float = 30.0
    log_json: bool = False
    log_level: str = "info"
    replay: str | None = None
    speed: float = 1.0
    # classifier thresholds (seconds); see docs/operator-guide.md for why these defaults
    hang_gpu_s: float = 10.0
    hang_host_s: float = 12.0
    hang_io_s: float = 30.0

    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not (0 < int(port) < 65536):
            raise ConfigError(f"listen: {self.listen!r} is not HOST:PORT")
        return host.strip("[]") or "127.0.0.1", int(port)

    def is_loopback(self) -> bool:
        host, _ = self.host_port()
        return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")

    def resolved_token(self) -> str | None:
        if self.token:
            return self.token
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip() or None
            except OSError as e:
                raise ConfigError(f"token_file: cannot read {self.token_file}: {e.strerror}") from e
        return None


def _coerce(name: str, typ: Any, value: Any) -> Any:
    if value is None:
        return None
    t = str(typ)
    try:
        if "float" in t:
            v = float(value)
            if v < 0:
                raise ValueError("must not be negative")
            return v
        if "bool" in t:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError("not a boolean")
        if "list" in t:
            if isinstance(value, list):
                return [str(x) for x in value]
            return [x.strip() for x in str(value).split(",") if x.strip()]
        return str(value)
    except ValueError as e:
        raise ConfigError(f"{name}: {value!r}: {e}") from e


def load_settings(flags: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                  config_path: str | None = None) -> Settings:
    """Build the settings; raises ConfigError with a one-line reason."""
    env = dict(os.environ) if env is None else env
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    values: dict[str, Any] = {}
    path = config_path or env.get("HANGD_CONFIG")
    if path or os.path.exists(DEFAULT_CONFIG):
        p = path or DEFAULT_CONFIG
        try:
            data = tomllib.loads(Path(p).read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"config file {p}: not found") from e
        except OSError as e:
            raise ConfigError(f"config file {p}: {e.strerror}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p}: not valid TOML: {e}") from e
        for k, v in data.items():
            if k not in fields:
                raise ConfigError(f"config file {p}: unknown setting {k!r}")
            values[k] = _coerce(k, fields[k].type, v)
    for k, f in fields.items():
        ev = env.get(f"HANGD_{k.upper()}")
        if ev is not None:
            values[k] = _coerce(f"HANGD_{k.upper()}", f.type, ev)
    for k, v in (flags or {}).items():
        if v is None:
            continue
        if k not in fields:
            raise ConfigError(f"unknown setting {k!r}")
        values[k] = _coerce(f"--{k.replace('_', '-')}", fields[k].type, v)
    s = Settings(**values)
    s.host_port()
    check_db_url(s.db)
    if s.interval <= 0:
        raise ConfigError(f"interval: {s.interval} must be > 0")
    return s
