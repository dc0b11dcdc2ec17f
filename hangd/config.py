"""One typed settings object, built at start (never at import) from, in order of precedence:
command-line flags, ``HANGD_*`` environment variables, a TOML file (``--config``,
``HANGD_CONFIG`` or ``/etc/hangd/hangd.toml`` when present), and the defaults here.

The layering is pydantic-settings': its sources, highest first, are the flags (init values), the
environment (``HANGD_`` + the field's name) and the TOML file; pydantic checks every value that
takes effect (type, finite, in range), and the one-line error names where the bad value came from
(``--interval``, ``HANGD_INTERVAL``, the file)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import stat
import tomllib
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from hangd.analysis.thresholds import Thresholds
from hangd.redact import redact_url, url_password
from hangd.safefile import NotRegularFile, TooLarge, read_regular

DEFAULT_PORT = 9877  # not taken by node_exporter (9100), dcgm-exporter (9400), Prometheus (9090)
DEFAULT_CONFIG = "/etc/hangd/hangd.toml"
MAX_SMALL_FILE = 1 << 20  # a settings or token file larger than this is not one


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


def read_small_file(path: str, what: str) -> bytes:
    """The bytes of a regular file of at most 1 MiB. A FIFO, device or directory is refused before
    it is opened (opening a FIFO would block start-up forever)."""
    try:
        st = os.stat(path)
    except FileNotFoundError as e:
        raise ConfigError(f"{what} {path}: not found") from e
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from e
    if os.path.realpath(path) == os.devnull:
        return b""  # "no configuration file", as people say it; a character device otherwise is refused
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {path}: not a regular file")
    try:
        # by file descriptor: a path swapped for a FIFO after the stat neither blocks nor is read
        data, _ = read_regular(path, MAX_SMALL_FILE, follow=True)
    except TooLarge:
        raise ConfigError(f"{what} {path}: larger than {MAX_SMALL_FILE} bytes") from None
    except NotRegularFile:
        raise ConfigError(f"{what} {path}: not a regular file") from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from e
    return data


def _seconds(lo: float, hi: float, *, lo_open: bool = False) -> Any:
    return Field(gt=lo, le=hi, allow_inf_nan=False) if lo_open else Field(ge=lo, le=hi, allow_inf_nan=False)


DAY = 86400.0


def _lower(v: Any) -> Any:
    return v.strip().lower() if isinstance(v, str) else v


def _split(v: Any) -> Any:
    return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v


def _token(v: str | None) -> str | None:
    if v is not None and v and not v.strip():
        raise ValueError("a token of only whitespace is no token")
    return v or None


LogLevel = Annotated[Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(_lower)]


@dataclass(frozen=True)
class _Layers:
    """What ``load_settings`` read for the sources below the flags: the environment and the TOML file."""

    env: Mapping[str, str]
    file: dict[str, Any]
    file_path: str | None


# set by load_settings while it builds Settings; unset, Settings(...) takes only what it is given
_LAYERS: ContextVar[_Layers | None] = ContextVar("hangd_settings_layers", default=None)


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over the mapping load_settings was given (the
    process's environment, or a test's), the way its own .env source swaps the mapping."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # only HANGD_ names, keyed as the source looks them up (lower case); an empty value (VAR= in
        # an env file) is unset
        return {k.lower(): v for k, v in self._given.items() if k.startswith("HANGD_") and v != ""}


class _TomlFile(PydanticBaseSettingsSource):
    """The settings file, already read (a FIFO or an oversized file never reaches here)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", validate_default=False, env_prefix="HANGD_",
                                      env_ignore_empty=True)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        layers = _LAYERS.get()
        if layers is None:  # Settings(...) in code and tests: exactly what it is given, nothing from the host
            return (init_settings,)
        return (init_settings, _Environment(settings_cls, layers.env), _TomlFile(settings_cls, layers.file))

    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    db: Annotated[str, Field(min_length=1, max_length=4096)] = Field(default_factory=default_db_url)
    interval: Annotated[float, _seconds(0.01, 3600)] = 1.0  # seconds between samples
    # the write token (ack, capture) also reads; the read token only reads (GET routes, /metrics)
    token: Annotated[str | None, AfterValidator(_token)] = None
    token_file: str | None = None
    read_token: Annotated[str | None, AfterValidator(_token)] = None
    read_token_file: str | None = None
    # where browsers reach this hangd (the links in alerts); "{node}" stands for node_name
    external_url: Annotated[str | None, Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2048)] = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    proc_root: Annotated[str, Field(min_length=1)] = "/proc"
    job_env: Annotated[list[str], NoDecode, BeforeValidator(_split)] = Field(default_factory=lambda: ["MASTER_ADDR", "TORCHELASTIC_RUN_ID"])
    # where a process's cgroup is read ("{pid}" in the path; empty: /proc/PID/cgroup) and the kubelet's
    # pod log folders, which name a pod by its uid (mounted read-only into hangd's container)
    cgroup_path: str = ""
    pod_log_dir: Annotated[str, Field(min_length=1)] = "/var/log/pods"
    nvml: bool = True
    stacks: bool = True
    pyspy_timeout: Annotated[float, _seconds(0.1, 600)] = 5.0
    retention_days: Annotated[float, _seconds(0, 36500, lo_open=True)] = 30.0
    log_json: bool = False
    log_level: LogLevel = "info"
    replay: str | None = None
    speed: Annotated[float, _seconds(0, 1e6)] = 1.0  # 0: as fast as possible
    # classifier thresholds (seconds); see docs/operator-guide.md for why these defaults
    hang_gpu_s: Annotated[float, _seconds(0, DAY, lo_open=True)] = Thresholds.hang_gpu_s
    hang_host_s: Annotated[float, _seconds(0, DAY, lo_open=True)] = Thresholds.hang_host_s
    hang_io_s: Annotated[float, _seconds(0, DAY, lo_open=True)] = Thresholds.hang_io_s
    # a process that exited stays listed (state "gone") in /processes and /jobs this long, then the
    # analysis forgets it (the store keeps its history)
    gone_after_s: Annotated[float, _seconds(0, DAY, lo_open=True)] = Thresholds.gone_after_s
    # /metrics cardinality: a process that exited keeps its series this long, then they go; at most
    # this many processes are exported (the rest are counted in hangd_series_dropped_total)
    metrics_gone_after_s: Annotated[float, _seconds(0, 30 * DAY)] = 300.0
    metrics_max_processes: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    # a fleet sharing one PostgreSQL: this node's name in it (default: the host name), how often
    # it reports that it is alive, and how old another node's last report may get before that
    # node counts as stopped (named in the job's view, never blamed)
    node_name: Annotated[str | None, Field(min_length=1, max_length=255)] = None
    heartbeat_s: Annotated[float, _seconds(0, 3600, lo_open=True)] = 2.0
    node_stale_s: Annotated[float, _seconds(0, DAY, lo_open=True)] = Thresholds.node_stale_s

    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not (0 < int(port) < 65536):
            raise ConfigError(f"listen: {self.listen!r} is not HOST:PORT")
        return host.strip("[]") or "127.0.0.1", int(port)

    def is_loopback(self) -> bool:
        host, _ = self.host_port()
        return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")

    def resolved_token(self) -> str | None:
        """The write token: HANGD_TOKEN or the content of token_file."""
        return _resolve(self.token, self.token_file, "token_file")

    def resolved_read_token(self) -> str | None:
        """The read-only token: HANGD_READ_TOKEN or the content of read_token_file."""
        return _resolve(self.read_token, self.read_token_file, "read_token_file")

    def tls(self) -> tuple[str, str] | None:
        """(certificate, key) files when hangd serves HTTPS; both or neither."""
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ConfigError("tls_certfile and tls_keyfile go together: give both (HTTPS) or neither (HTTP)")
        return (self.tls_certfile, self.tls_keyfile) if self.tls_certfile and self.tls_keyfile else None


def _resolve(token: str | None, path: str | None, what: str) -> str | None:
    if token:
        return token
    if path:
        if not os.path.lexists(path):
            # fail closed, saying what to do: a pod whose Secret is missing lands here
            raise ConfigError(f"{what} {path}: not found. HINT: write a long random token there (openssl rand -hex 32); "
                              "under Kubernetes create the Secret hangd-token (docs/kubernetes.md)")
        raw = read_small_file(path, what)
        try:
            tok = raw.decode().strip()
        except UnicodeDecodeError as e:
            raise ConfigError(f"{what} {path}: not UTF-8 text") from e
        if not tok:
            raise ConfigError(f"{what} {path}: empty (or only whitespace)")
        return tok
    return None


SECRET_FIELDS = ("token", "read_token", "db")  # a URL may carry a password: never echo these in an error


def _where(name: str, flags: Mapping[str, Any], env: Mapping[str, str], file_path: str | None) -> str:
    """The layer a field's value came from: the highest one that has it (the flags, the
    environment, the file), as an operator would look for it."""
    if flags.get(name) is not None:
        return f"--{name.replace('_', '-')}"
    if env.get(f"HANGD_{name.upper()}"):
        return f"HANGD_{name.upper()}"
    return f"config file {file_path}: {name}" if file_path else name


def _one_line(e: ValidationError, flags: Mapping[str, Any], env: Mapping[str, str], file_path: str | None) -> ConfigError:
    err = e.errors()[0]
    loc = err.get("loc") or ("?",)
    name = str(loc[0])
    msg = str(err.get("msg", "invalid")).replace("\n", " ").removeprefix("Value error, ")
    shown = "(value not shown)" if name in SECRET_FIELDS else repr(err.get("input"))
    return ConfigError(f"{_where(name, flags, env, file_path)}: {shown[:80]}{'...' if len(shown) > 80 else ''}: {msg}")


def load_settings(flags: dict[str, Any] | None = None, env: Mapping[str, str] | None = None,
                  config_path: str | None = None) -> Settings:
    """Build the settings; raises ConfigError with a one-line reason."""
    env = dict(os.environ) if env is None else env
    fields = Settings.model_fields
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    for k in flags:
        if k not in fields:
            raise ConfigError(f"unknown setting {k!r}")
    data: dict[str, Any] = {}
    path = config_path or env.get("HANGD_CONFIG")
    p: str | None = None
    if path or os.path.exists(DEFAULT_CONFIG):
        p = path or DEFAULT_CONFIG
        raw = read_small_file(p, "config file")
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {p}: not UTF-8 text (byte {e.start})") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p}: not valid TOML: {e}") from e
        for k in data:
            if k not in fields:
                raise ConfigError(f"config file {p}: unknown setting {k!r}")
    token = _LAYERS.set(_Layers(env=env, file=data, file_path=p))
    try:
        s = Settings(**flags)
    except ValidationError as e:
        raise _one_line(e, flags, env, p) from None
    finally:
        _LAYERS.reset(token)
    s.host_port()
    check_db_url(s.db)
    return s


# the Thresholds fields whose setting has another name (none now: gone_after_s is one name for both)
THRESHOLD_SETTINGS: dict[str, str] = {}


def thresholds_from(settings: Settings) -> Thresholds:
    """The analysis' limits as configured: every ``Thresholds`` field that has a setting (of its
    own name, or the one ``THRESHOLD_SETTINGS`` gives) takes the setting's value; the others keep
    their defaults. The one place the thresholds are built: serve, status, record and watch judge
    a job alike."""
    given = {}
    for f in dataclasses.fields(Thresholds):
        name = THRESHOLD_SETTINGS.get(f.name, f.name)
        if name in Settings.model_fields:
            given[f.name] = getattr(settings, name)
    return Thresholds(**given)


def seconds_arg(lo: float = 0.0, hi: float = 365 * DAY, *, lo_open: bool = True) -> Callable[[str], float]:
    """An argparse ``type``: a finite number of seconds in range, else a one-line usage error."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi
        if not ok:
            bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {bound} and <= {hi:g}")
        return v
    return parse
