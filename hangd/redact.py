"""Secret redaction, applied where data enters hangd (the sources), never later.

Process environments and command lines carry tokens. hangd keeps only the environment keys it
needs and replaces the value of any secret-looking key, and any credentials inside a URL, with
``REDACTED``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

SECRET_KEY_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
# scheme://user:password@host -> scheme://user:<redacted>@host ; scheme://token@host -> scheme://<redacted>@host
URL_CRED_RE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@\s:]*)(?::(?P<pw>[^/@\s]*))?@")
# --token=abc, --api-key abc (the value in the next argument is handled in redact_cmdline)
FLAG_RE = re.compile(r"^(?P<flag>--?[\w.-]*(?:token|key|secret|password|passwd|credential|auth)[\w.-]*)(?P<eq>=)(?P<val>.*)$", re.I)

# Environment keys hangd needs: launcher and rank identity, NCCL/torch settings (dump paths),
# job ids, and where a process's home and cache are (for flight-recorder defaults).
DEFAULT_ENV_KEEP: tuple[str, ...] = (
    "NCCL_*", "TORCH_*", "TORCHELASTIC_*", "MASTER_*", "RANK", "LOCAL_RANK", "GROUP_RANK",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_RANK", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
    "SLURM_*", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_*", "JOB_ID", "KUBERNETES_*", "POD_NAME",
    "HOME", "XDG_CACHE_HOME", "USER",
)


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY_RE.search(key))


def redact_url_credentials(value: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if m.group("pw") is not None:
            return f"{m.group('scheme')}{m.group('user')}:{REDACTED}@"
        return f"{m.group('scheme')}{REDACTED}@"

    return URL_CRED_RE.sub(repl, value)


def redact_value(key: str, value: str) -> str:
    if is_secret_key(key):
        return REDACTED
    return redact_url_credentials(value)


def filter_environ(env: Mapping[str, str], keep: Iterable[str] = DEFAULT_ENV_KEEP) -> dict[str, str]:
    """Only the keys hangd needs, each secret-looking value redacted."""
    pats = tuple(keep)
    out: dict[str, str] = {}
    for k, v in env.items():
        if any(fnmatch.fnmatchcase(k, p) for p in pats):
            out[k] = redact_value(k, v)
    return out


def redact_cmdline(argv: Iterable[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        m = FLAG_RE.match(arg)
        if m:
            out.append(f"{m.group('flag')}={REDACTED}")
            continue
        if arg.startswith("-") and "=" not in arg and is_secret_key(arg.lstrip("-").replace("-", "_")):
            hide_next = True
            out.append(arg)
            continue
        out.append(redact_url_credentials(arg))
    return out


def redact_text(text: str) -> str:
    """Free text (a log line): credentials in URLs and ``KEY=value`` pairs of secret keys."""
    text = redact_url_credentials(text)
    return re.sub(
        r"\b(?P<k>[A-Za-z_][A-Za-z0-9_]*)=(?P<v>\S+)",
        lambda m: f"{m.group('k')}={REDACTED}" if is_secret_key(m.group("k")) else m.group(0),
        text,
    )
