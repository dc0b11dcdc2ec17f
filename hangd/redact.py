"""Secret redaction: one set of functions for everything that leaves a hangd process.

Process environments, command lines and logs carry tokens. hangd keeps only the environment
keys it needs and replaces with ``REDACTED``: the value of any secret-looking key (in an
environment, a ``key=value`` or ``key: value`` pair, JSON, a ``--flag value``), credentials
inside a URL, secret query parameters, and strings shaped like well-known tokens (``hf_...``,
``ghp_...``, ``AKIA...``, JWTs). Sources redact where data enters; the store, the API, the logs,
recordings and error messages redact again on the way out, so a secret that slipped past one
place is still caught. Every function here is idempotent: redacting twice changes nothing more.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote

REDACTED = "<redacted>"

SECRET_KEY_RE = re.compile(r"TOKEN|KEY|SECRET|PASS|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
# Names that contain a secret word but name something else: exception types in tracebacks
# ("KeyError: 'rank'"), keyboard interrupts, counts of tokens or keys ("max_tokens=4096").
_NOT_SECRET_KEY_RE = re.compile(r"(Error|Exception|Warning|Interrupt)$|^Keyboard|(TOKENS|KEYS)$", re.I)
# Query parameters that carry a credential without saying so (signed URLs).
_QUERY_SECRET_RE = re.compile(r"^(sig|signature|x-amz-signature|x-goog-signature|x-amz-security-token|pwd|"
                              r"code_verifier)$", re.I)

# scheme://user:password@host -> scheme://user:<redacted>@host ; scheme://token@host -> scheme://<redacted>@host
# The password runs to the *last* '@' before the path: "p@ss" in postgres://u:p@ss@host/db is one password.
URL_CRED_RE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@\s:]*)(?::(?P<pw>[^/\s]*))?@")
# --token=abc, --api-key abc (the value in the next argument is handled in redact_cmdline)
FLAG_RE = re.compile(r"^(?P<flag>--?[\w.-]*(?:token|key|secret|pass|credential|auth)[\w.-]*)(?P<eq>=)(?P<val>.*)$", re.I)

_AUTH_SCHEME = r"(?:(?:Bearer|Basic|Token|Digest|Negotiate)\s+)?"
_QUOTED = r"\"[^\"\n]*\"|'[^'\n]*'"
# ?token=..., &sig=... in URLs
_QUERY_RE = re.compile(r"(?P<pre>[?&;](?P<k>[A-Za-z][\w.-]*)=)(?P<v>[^&#\s\"'<>]+)")
# A name that says its value is a secret, as a pattern (the same test as is_secret_key), so that a
# pattern never starts at an ordinary "name:" and swallows the secret pair after it on the line.
_KEY = (r"(?P<k>(?![\w.-]*(?:error|exception|warning|interrupt|tokens|keys)(?![\w.-]))(?!keyboard)"
        r"(?=[\w.-]*(?:token|key|secret|pass|credential|auth|cookie|session))[A-Za-z_][\w.-]*)")
# --hf-token VALUE, --hf-token=VALUE (-p VALUE is not handled: a one-letter flag says nothing)
_TEXT_FLAG_RE = re.compile(r"(?<![\w-])(?P<flag>--" + _KEY + r")(?P<sep>=|[ \t]+)(?P<v>" + _QUOTED + r"|(?!-)\S+)", re.I)
# "api_key": "v", 'api_key': 'v', "api_key": 123
_JSON_RE = re.compile(r"(?P<pre>(?P<q>[\"'])(?P<k>[^\"'\n]{1,100})(?P=q)\s*:\s*)(?P<v>" + _QUOTED + r"|[^\s,}\]\"']+)")
# api_key=v, password = v, API_KEY="a b" (not after ? or &: query parameters are _QUERY_RE's)
_ASSIGN_RE = re.compile(r"(?<![\w.?&-])" + _KEY + r"(?P<sep>[ \t]*=[ \t]*)(?P<v>" + _AUTH_SCHEME
                        + "(?:" + _QUOTED + r"|[^\s,;&]+))", re.I)
# api_key: v, Authorization: Bearer v (to the end of the line: a YAML or header value has spaces)
_COLON_RE = re.compile(r"(?<![\w./-])" + _KEY + r"(?P<sep>:[ \t]*)(?P<v>(?!//)[^\s].*)", re.I)
# Well-known token shapes, wherever they appear.
_TOKEN_SHAPES_RE = re.compile(
    r"(?<![A-Za-z0-9_])(?:"
    r"hf_[A-Za-z0-9]{20,}"                       # Hugging Face
    r"|gh[pousr]_[A-Za-z0-9]{30,}"               # GitHub classic and app tokens
    r"|github_pat_[A-Za-z0-9_]{40,}"             # GitHub fine-grained
    r"|glpat-[A-Za-z0-9_-]{20,}"                 # GitLab
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"                # AWS access key ids
    r"|sk-[A-Za-z0-9_-]{20,}"                    # OpenAI / Anthropic style API keys
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"            # Slack
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    r")"
)

# Environment keys hangd needs: launcher and rank identity, NCCL/torch settings (dump paths),
# job ids, and where a process's home and cache are (for flight-recorder defaults).
DEFAULT_ENV_KEEP: tuple[str, ...] = (
    "NCCL_*", "TORCH_*", "TORCHELASTIC_*", "MASTER_*", "RANK", "LOCAL_RANK", "GROUP_RANK",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_RANK", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
    "SLURM_*", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_*", "JOB_ID", "KUBERNETES_*", "POD_NAME",
    "POD_NAMESPACE", "CONTAINER_NAME", "HOSTNAME", "HOME", "XDG_CACHE_HOME", "USER",
)


def is_secret_key(key: str) -> bool:
    """Whether a variable, field or flag name says its value is a secret (HF_TOKEN, api-key,
    db_password, SLURM's pass=...). ``KeyError`` and ``max_tokens`` are not."""
    return bool(SECRET_KEY_RE.search(key)) and not _NOT_SECRET_KEY_RE.search(key)


def redact_url_credentials(value: str) -> str:
    def repl(m: re.Match[str]) -> str:
        if m.group("pw") is not None:
            return f"{m.group('scheme')}{m.group('user')}:{REDACTED}@"
        return f"{m.group('scheme')}{REDACTED}@"

    return URL_CRED_RE.sub(repl, value)


def redact_query(value: str) -> str:
    """``?token=...``, ``&access_token=...``, ``&sig=...`` in URLs."""
    def repl(m: re.Match[str]) -> str:
        k = m.group("k")
        return m.group("pre") + REDACTED if is_secret_key(k) or _QUERY_SECRET_RE.match(k) else m.group(0)

    return _QUERY_RE.sub(repl, value)


def redact_token_shapes(value: str) -> str:
    return _TOKEN_SHAPES_RE.sub(REDACTED, value)


def redact_value(key: str, value: str) -> str:
    """An environment variable's value: all of it for a secret key, else what ``redact_text``
    finds inside it (``SLURM_JOB_COMMENT=pass=...``, a URL with a password)."""
    if is_secret_key(key):
        return REDACTED
    return redact_text(value)


def filter_environ(env: Mapping[str, str], keep: Iterable[str] = DEFAULT_ENV_KEEP) -> dict[str, str]:
    """Only the keys hangd needs, each secret-looking value redacted."""
    pats = tuple(keep)
    out: dict[str, str] = {}
    for k, v in env.items():
        if any(fnmatch.fnmatchcase(k, p) for p in pats):
            out[k] = redact_value(k, v)
    return out


def _secret_flag(arg: str) -> bool:
    return arg.startswith("-") and "=" not in arg and is_secret_key(arg.lstrip("-"))


def redact_cmdline(argv: Iterable[str]) -> list[str]:
    """A command line, argument by argument: the value after a secret flag (``--hf-token V``),
    ``--flag=V``, ``key=V``, URL credentials and query tokens, token shapes."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not arg.startswith("--"):  # "--use-auth --verbose": the next flag is no value
                out.append(REDACTED)
                continue
        m = FLAG_RE.match(arg)
        if m and not _NOT_SECRET_KEY_RE.search(m.group("flag")):
            out.append(f"{m.group('flag')}={REDACTED}")
            continue
        if _secret_flag(arg):
            hide_next = True
            out.append(arg)
            continue
        out.append(redact_text(arg))
    return out


def _quoted_like(v: str, new: str) -> str:
    q = v[0] if v[:1] in ("'", '"') else ""
    return f"{q}{new}{q}"


def _keep_scheme(v: str) -> str:
    """``Bearer abc`` -> ``Bearer <redacted>``: the scheme helps, the credential does not."""
    head, _, rest = v.partition(" ")
    if rest and head.lower() in ("bearer", "basic", "token", "digest", "negotiate"):
        return f"{head} {REDACTED}"
    return REDACTED


def redact_text(text: str) -> str:
    """Free text (a log line, an error message, one argument): credentials in URLs, secret query
    parameters, ``--secret-flag V``, ``"secret": "V"``, ``secret=V``, ``secret: V`` (to the end of
    the line) and well-known token shapes."""
    if not text:
        return text
    text = redact_url_credentials(text)
    text = redact_query(text)
    text = _TEXT_FLAG_RE.sub(lambda m: f"{m.group('flag')}{m.group('sep')}{REDACTED}", text)
    text = _JSON_RE.sub(
        lambda m: m.group("pre") + _quoted_like(m.group("v"), REDACTED) if is_secret_key(m.group("k")) else m.group(0),
        text)
    text = _ASSIGN_RE.sub(lambda m: f"{m.group('k')}{m.group('sep')}{_keep_scheme(m.group('v'))}", text)
    text = _COLON_RE.sub(lambda m: f"{m.group('k')}{m.group('sep')}{_keep_scheme(m.group('v'))}", text)
    return redact_token_shapes(text)


# Field names in hangd's own records that contain a secret word but hold no secret.
_STRUCTURAL_FIELDS = frozenset({"key", "keys"})


def redact_obj(value: Any) -> Any:
    """A JSON-like value (API response, stored evidence, a recorded event): the value of every
    secret-looking key, and every string through ``redact_text``. Returns a new value."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and k.lower() not in _STRUCTURAL_FIELDS and is_secret_key(k) and v is not None:
                out[k] = REDACTED
            else:
                out[k] = redact_obj(v)
        return out
    if isinstance(value, list):
        return [redact_obj(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_obj(v) for v in value)
    return value


def redact_known(text: str, secrets: Iterable[str | None]) -> str:
    """Replace known secret strings (a password from a URL the operator gave, raw and
    percent-encoded) wherever a library quoted them in an error."""
    for s in secrets:
        if not s or len(s) < 3:
            continue  # a one- or two-letter "secret" would blank out ordinary words
        for form in {s, quote(s, safe=""), unquote(s)}:
            text = text.replace(form, REDACTED)
    return text


def url_password(url: str) -> str | None:
    """The password in ``scheme://user:password@host``, up to the last '@' (None when absent)."""
    m = URL_CRED_RE.search(url)
    return m.group("pw") if m else None


def redact_url(url: str) -> str:
    """A database or service URL for a message: user, host and path kept, password hidden."""
    return redact_text(url)


class RedactingFormatter(logging.Formatter):
    """Wraps a formatter so that every formatted record, traceback included, is redacted."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(self.inner.format(record))
