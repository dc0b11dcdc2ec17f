"""Redaction: a corpus of real-looking lines, each with the secret that must vanish and the
words an operator still needs to see; command lines, environments, records; idempotence."""

from __future__ import annotations

import logging

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hangd.redact import (
    REDACTED,
    RedactingFormatter,
    filter_environ,
    is_secret_key,
    redact_cmdline,
    redact_known,
    redact_obj,
    redact_text,
    redact_value,
    url_password,
)

from .fuzz import examples

# (line, secrets that must not survive, text that must survive)
CORPUS: list[tuple[str, list[str], list[str]]] = [
    ("python train.py api_key=sk12345abc lr=3e-4", ["sk12345abc"], ["python train.py api_key=", "lr=3e-4"]),
    ("api_key: 9f8e7d6c5b4a", ["9f8e7d6c5b4a"], ["api_key: "]),
    ("  wandb_api_key:   'abc def ghi'", ["abc def ghi", "abc"], ["wandb_api_key:"]),
    ('{"api_key": "k-123456", "lr": 0.1}', ["k-123456"], ['"api_key": "', '"lr": 0.1']),
    ("{'password': 'hunter2', 'user': 'bob'}", ["hunter2"], ["'user': 'bob'"]),
    ('{"auth_token": 1234567890}', ["1234567890"], ['"auth_token": ']),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abc", ["eyJhbGciOiJIUzI1NiJ9abc"], ["Authorization: Bearer "]),
    ("curl -H 'authorization: Basic dXNlcjpwYXNz' https://h/x", ["dXNlcjpwYXNz"], ["curl -H", "Basic"]),
    ("X-Api-Key: abcdef123456", ["abcdef123456"], ["X-Api-Key:"]),
    ("password = hunter2", ["hunter2"], ["password = "]),
    ('DB_PASSWORD="correct horse battery"', ["correct horse battery", "horse"], ["DB_PASSWORD="]),
    ("torchrun train.py --hf-token hf_abcdefghijklmnopqrstuvwxyz --lr 1", ["hf_abcdefghijklmnopqrstuvwxyz"],
     ["--hf-token ", "--lr 1"]),
    ("torchrun train.py --hf-token=SeCrEtVaLuE --epochs 3", ["SeCrEtVaLuE"], ["--hf-token=", "--epochs 3"]),
    ("run --API-KEY=ABCDEF0123 --x", ["ABCDEF0123"], ["--API-KEY="]),
    ("run --db-password 'p w d' --verbose", ["p w d"], ["--db-password", "--verbose"]),
    ("connecting to postgres://u:p@ss@db.example.invalid:5432/hangd", ["p@ss", "ss@db"],
     ["postgres://u:", "@db.example.invalid:5432/hangd"]),
    ("postgresql+psycopg://hangd:s3cr3t@127.0.0.1/hangd", ["s3cr3t"], ["postgresql+psycopg://hangd:", "@127.0.0.1/hangd"]),
    ("git clone https://ghp_TOKENTOKEN1234@github.com/org/repo.git", ["ghp_TOKENTOKEN1234"], ["@github.com/org/repo.git"]),
    ("pip install --index-url https://__token__:pypi-AgEIcHlwaS5vcmc@pypi.example/simple x",
     ["pypi-AgEIcHlwaS5vcmc"], ["https://__token__:", "@pypi.example/simple"]),
    ("GET https://api.example/v1/x?token=abcd1234&page=2", ["abcd1234"], ["?token=", "&page=2"]),
    ("redirect to https://h/cb?code=1&access_token=zzzz9999#frag", ["zzzz9999"], ["access_token=", "#frag"]),
    ("s3 url https://bucket.s3/obj?X-Amz-Signature=deadbeef01&X-Amz-Credential=AKIAXX%2F", ["deadbeef01", "AKIAXX"],
     ["X-Amz-Signature=", "X-Amz-Credential="]),
    ("https://account.blob.example/c/b?sv=2022&sig=Zm9vYmFyYmF6&se=2026", ["Zm9vYmFyYmF6"], ["sv=2022", "&se=2026"]),
    ("SLURM_JOB_COMMENT: pass=letmein123 priority", ["letmein123"], ["SLURM_JOB_COMMENT: pass="]),
    ("export HF_TOKEN=hf_EXAMPLEsecret WANDB_API_KEY=abc OK=1", ["hf_EXAMPLEsecret", "=abc"], ["OK=1"]),
    ("loaded token hf_AbCdEfGhIjKlMnOpQrStUvWx from cache", ["hf_AbCdEfGhIjKlMnOpQrStUvWx"], ["loaded token", "from cache"]),
    ("push with ghp_abcdefghijklmnopqrstuvwxyz0123456789 done", ["ghp_abcdefghijklmnopqrstuvwxyz0123456789"], ["done"]),
    ("aws id AKIAIOSFODNN7EXAMPLE in env", ["AKIAIOSFODNN7EXAMPLE"], ["aws id", "in env"]),
    ("slack xoxb-1234567890-abcdefghij posted", ["xoxb-1234567890-abcdefghij"], ["posted"]),
    ("client key sk-proj-abcdefghijklmnopqrstuvwx1234", ["sk-proj-abcdefghijklmnopqrstuvwx1234"], ["client key"]),
    ("credentials=AAAA1111 region=us", ["AAAA1111"], ["region=us"]),
    ("my_secret=xyz123;next=1", ["xyz123"], ["next=1"]),
    ("session_cookie: abcdefg", ["abcdefg"], ["session_cookie:"]),
]

# Lines that must come out unchanged: tracebacks, counters, ordinary URLs and paths.
UNCHANGED = [
    "KeyError: 'rank'",
    "Traceback (most recent call last):",
    '  File "/opt/app/train.py", line 42, in <module>',
    "step 120 loss=1.234 lr=3e-4 tokens/s=51234",
    "max_tokens=4096 num_keys=12",
    "see https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_reduce",
    "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "KeyboardInterrupt",
    "rank 1 never entered all_reduce #399 (67108864 float32) in pg 0 (default_pg)",
    f"already {REDACTED}",
]


@pytest.mark.parametrize(("line", "secrets", "kept"), CORPUS, ids=[c[0][:40] for c in CORPUS])
def test_corpus_line_loses_its_secret_and_keeps_the_rest(line, secrets, kept):
    out = redact_text(line)
    for s in secrets:
        assert s not in out, out
    for k in kept:
        assert k in out, out
    assert REDACTED in out
    assert redact_text(out) == out  # idempotent


@pytest.mark.parametrize("line", UNCHANGED)
def test_ordinary_lines_are_left_alone(line):
    assert redact_text(line) == line


def test_command_lines():
    argv = ["torchrun", "--nproc-per-node", "2", "train.py", "--hf-token", "hf_x1", "--API-KEY=k2",
            "api_key=k3", "--data", "https://tok@host/d?sig=k4", "--use-auth", "--verbose",
            "--db", "postgres://u:p@ss@h/db"]
    out = redact_cmdline(argv)
    joined = " ".join(out)
    for s in ("hf_x1", "k2", "k3", "tok@", "k4", "p@ss", "ss@h"):
        assert s not in joined, joined
    assert out[:4] == ["torchrun", "--nproc-per-node", "2", "train.py"]
    assert out[4:6] == ["--hf-token", REDACTED]
    assert "--verbose" in out  # a flag after a boolean secret-looking flag is not taken for its value
    assert redact_cmdline(out) == out


def test_environments():
    env = {"HF_TOKEN": "x", "NCCL_IB_HCA": "mlx5", "TORCH_HUB_PASSWORD": "p", "MASTER_ADDR": "10.0.0.1",
           "SLURM_JOB_COMMENT": "pass=letmein run=3", "SLURM_DB_PASS": "p2", "SLURM_CREDENTIAL": "c",
           "TORCH_AUTH_HEADER": "Bearer z", "TORCH_API_SECRET": "s", "PATH": "/bin",
           "TORCH_STORE_URL": "https://user:pw@example.invalid/x?token=t"}
    out = filter_environ(env)
    assert "PATH" not in out and "HF_TOKEN" not in out  # not needed: not kept at all
    assert out["NCCL_IB_HCA"] == "mlx5" and out["MASTER_ADDR"] == "10.0.0.1"
    for k in ("TORCH_HUB_PASSWORD", "SLURM_DB_PASS", "SLURM_CREDENTIAL", "TORCH_AUTH_HEADER", "TORCH_API_SECRET"):
        assert out[k] == REDACTED, k
    assert out["SLURM_JOB_COMMENT"] == f"pass={REDACTED} run=3"
    assert out["TORCH_STORE_URL"] == f"https://user:{REDACTED}@example.invalid/x?token={REDACTED}"
    assert redact_value("MY_KEY", "v") == REDACTED


def test_redaction_of_secret_keys_urls_and_flags():
    env = filter_environ({"HF_TOKEN": "x", "NCCL_IB_HCA": "mlx5", "TORCH_HUB_PASSWORD": "p",
                          "MASTER_ADDR": "https://u:pw@h:1", "PATH": "/bin"})
    assert env == {"NCCL_IB_HCA": "mlx5", "TORCH_HUB_PASSWORD": REDACTED, "MASTER_ADDR": f"https://u:{REDACTED}@h:1"}
    assert redact_cmdline(["python", "--api-key", "k", "--token=t", "s3://AKIA:sec@bucket/x"]) == \
        ["python", "--api-key", REDACTED, f"--token={REDACTED}", f"s3://AKIA:{REDACTED}@bucket/x"]
    assert redact_text("export WANDB_API_KEY=abc and HF_TOKEN=hf_123 ok=1") == \
        f"export WANDB_API_KEY={REDACTED} and HF_TOKEN={REDACTED} ok=1"


@pytest.mark.parametrize("key", ["HF_TOKEN", "api-key", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "PGPASS",
                                 "GOOGLE_CREDENTIALS", "HTTP_AUTH", "session_cookie", "passwd"])
def test_secret_key_names(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["KeyError", "KeyboardInterrupt", "max_tokens", "RANK", "MASTER_ADDR", "lr"])
def test_names_that_are_not_secrets(key):
    assert not is_secret_key(key)


def test_records_for_the_api_and_the_store():
    rec = {"id": 3, "key": "job-abc", "summary": "rank 1 waits; HF_TOKEN=hf_s1",
           "evidence": {"environ": {"0": {"WANDB_API_KEY": "w1", "RANK": "0"}},
                        "logs": {"0": ["ok", "Authorization: Bearer b1"]}, "cmdline": ["x", "--token", "t1"],
                        "pair": ("a", "password=p1")},
           "api_token": None}
    out = redact_obj(rec)
    text = repr(out)
    for s in ("hf_s1", "w1", "b1", "p1"):
        assert s not in text, text
    assert out["key"] == "job-abc" and out["id"] == 3 and out["api_token"] is None
    assert out["evidence"]["environ"]["0"]["WANDB_API_KEY"] == REDACTED
    assert out["evidence"]["logs"]["0"] == ["ok", f"Authorization: Bearer {REDACTED}"]
    assert out["evidence"]["pair"] == ("a", f"password={REDACTED}")
    assert out["evidence"]["environ"]["0"]["RANK"] == "0"
    assert isinstance(out["evidence"]["pair"], tuple)
    assert rec["evidence"]["environ"]["0"]["WANDB_API_KEY"] == "w1"  # a new value; the input is untouched
    assert redact_obj(out) == out


def test_known_secrets_and_url_passwords():
    url = "postgresql://u:p@ss%2Fword@h/db"
    assert url_password(url) == "p@ss%2Fword"
    assert url_password("sqlite:////var/lib/hangd/hangd.db") is None
    msg = "failed to resolve host 'ss/word@h' for p@ss/word"
    assert "p@ss/word" not in redact_known(msg, [url_password(url)])
    assert redact_known("a b", ["", None, "ab"]) == "a b"  # nothing short enough to blank out words


def test_log_records_are_redacted_tracebacks_included():
    fmt = RedactingFormatter(logging.Formatter("%(levelname)s %(message)s"))
    try:
        raise RuntimeError("connect postgres://u:hunter2@h/db failed")
    except RuntimeError:
        import sys
        rec = logging.LogRecord("hangd", logging.ERROR, __file__, 1, "token=%s", ("t0ps3cret",), sys.exc_info())
    out = fmt.format(rec)
    assert "t0ps3cret" not in out and "hunter2" not in out
    assert "Traceback" in out and "RuntimeError" in out


_line = st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=80)


@settings(max_examples=examples(500), deadline=None)
@given(prefix=_line, secret=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=24),
       form=st.sampled_from(["{k}={s}", "{k}: {s}", '"{k}": "{s}"', "--{k} {s}", "--{k}={s}", "https://u:{s}@h/x",
                             "https://h/x?{k}={s}"]),
       key=st.sampled_from(["api_key", "HF_TOKEN", "password", "db-pass", "secret", "auth", "access_token"]))
def test_a_secret_in_any_form_after_any_text_is_gone(prefix, secret, form, key):
    assume(secret not in prefix)
    line = prefix + " " + form.format(k=key, s=secret)
    out = redact_text(line)
    assert secret not in out, out
    assert redact_text(out) == out


@settings(max_examples=examples(500), deadline=None)
@given(text=st.text(max_size=200))
def test_redaction_is_idempotent_and_never_fails(text):
    once = redact_text(text)
    assert redact_text(once) == once


@pytest.mark.parametrize("token", [
    "hf_" + "a1" * 10, "ghp_" + "A" * 30, "gho_" + "b" * 36, "github_pat_" + "C_" * 20, "glpat-" + "x" * 20,
    "AKIA" + "A1B2C3D4E5F6G7H8", "ASIA" + "Z" * 16, "sk-" + "q" * 20, "xoxb-" + "1" * 10,
    "eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl",
])
def test_token_shapes(token):
    assert redact_text(f"value {token} end") == f"value {REDACTED} end"
    assert redact_text(f"x{token}") == f"x{token}"  # inside a longer word: not a token


@pytest.mark.parametrize("word", ["hf_short", "ghp_abc", "AKIA1234", "sk-abc", "xoxb-1", "eyJhbGci", "glpat-x"])
def test_short_look_alikes_are_left_alone(word):
    assert redact_text(f"value {word} end") == f"value {word} end"


@pytest.mark.parametrize("name", ["sig", "Signature", "X-Amz-Signature", "x-goog-signature", "x-amz-security-token",
                                  "pwd", "code_verifier", "apikey", "access_token"])
def test_secret_query_parameters(name):
    assert redact_text(f"https://h/p?a=1&{name}=v4lue&b=2") == f"https://h/p?a=1&{name}={REDACTED}&b=2"


@pytest.mark.parametrize("name", ["page", "sigma", "code", "design"])
def test_ordinary_query_parameters(name):
    assert redact_text(f"https://h/p?{name}=v4lue") == f"https://h/p?{name}=v4lue"


@pytest.mark.parametrize(("line", "out"), [
    ("Authorization: Bearer abc", f"Authorization: Bearer {REDACTED}"),
    ("Authorization: basic abc", f"Authorization: basic {REDACTED}"),
    ("Authorization: Token abc", f"Authorization: Token {REDACTED}"),
    ("Authorization: Digest abc", f"Authorization: Digest {REDACTED}"),
    ("Authorization: Negotiate abc", f"Authorization: Negotiate {REDACTED}"),
    ("Authorization: Other abc", f"Authorization: {REDACTED}"),
    ("Authorization: Bearer", f"Authorization: {REDACTED}"),
    ("authorization=Bearer abc", f"authorization=Bearer {REDACTED}"),
    ('{"token": "a b"}', f'{{"token": "{REDACTED}"}}'),
    ("{'token': 'a'}", f"{{'token': '{REDACTED}'}}"),
    ('{"token": 12}', f'{{"token": {REDACTED}}}'),
    ('{"other": "a", "token": "b"}', f'{{"other": "a", "token": "{REDACTED}"}}'),
    ("token: a b c", f"token: {REDACTED}"),
    ("token:abc", f"token:{REDACTED}"),
    ("token://x", "token://x"),
    ("A: api_key: 0000", f"A: api_key: {REDACTED}"),
    ("a=api_key=0000", f"a=api_key={REDACTED}"),
    ("api_key='a b' next=1", f"api_key={REDACTED} next=1"),
    ("--token 'a b' --x", f"--token {REDACTED} --x"),
    ("--token --x", "--token --x"),
    ("-token abc", "-token abc"),
    ("--max-tokens 5", "--max-tokens 5"),
    ("KeyError: 'x'", "KeyError: 'x'"),
    ("AuthError: denied", "AuthError: denied"),
    ("TokenException: x", "TokenException: x"),
    ("PasswordWarning: x", "PasswordWarning: x"),
    ("keyboard: us", "keyboard: us"),
    ("num_keys=5", "num_keys=5"),
    ("my.api_key=5", "my.api_key=" + REDACTED),
    ("", ""),
])
def test_forms_one_by_one(line, out):
    assert redact_text(line) == out


def test_command_line_details():
    assert redact_cmdline(["--token", "--next", "v"]) == ["--token", "--next", "v"]
    assert redact_cmdline(["--token", "-v"]) == ["--token", REDACTED]
    assert redact_cmdline(["--max-tokens=5", "--keys=3", "--api-key=", "-k=v", "-auth=v"]) == \
        ["--max-tokens=5", "--keys=3", f"--api-key={REDACTED}", "-k=v", f"-auth={REDACTED}"]
    assert redact_cmdline(["--hf_token", "a", "b"]) == ["--hf_token", REDACTED, "b"]
    assert redact_cmdline(["--password=a=b"]) == [f"--password={REDACTED}"]
    assert redact_cmdline(["--KeyError", "x"]) == ["--KeyError", "x"]
    # a flag that only looks secret keeps the next argument, whether or not it carries a value
    assert redact_cmdline(["--max-tokens=5", "val"]) == ["--max-tokens=5", "val"]
    assert redact_cmdline(["--keyboard", "us"]) == ["--keyboard", "us"]
    assert redact_cmdline([]) == []


def test_environment_keep_patterns():
    assert filter_environ({"A": "1", "B": "token=x", "C": "3"}, keep=["A", "B"]) == {"A": "1", "B": f"token={REDACTED}"}
    assert filter_environ({"NCCL_X": "1"}, keep=[]) == {}
    assert redact_value("PLAIN", "https://u:p@h") == f"https://u:{REDACTED}@h"


def test_known_secret_forms():
    assert redact_known("pw is a@b and a%40b", ["a@b"]) == f"pw is {REDACTED} and {REDACTED}"
    assert redact_known("pw is a@b and a%40b", ["a%40b"]) == f"pw is {REDACTED} and {REDACTED}"
    assert redact_known("abc abd", ["abc"]) == f"{REDACTED} abd"
    assert redact_known("ab", ["ab"]) == "ab"
    assert redact_known("ab abc", ["ab", "abc"]) == f"ab {REDACTED}"  # a short one does not stop the rest
    assert redact_known("in url a%2Fb%40c", ["a/b@c"]) == f"in url {REDACTED}"  # '/' encoded too


def test_urls():
    assert redact_text("ssh://git@host/x") == f"ssh://{REDACTED}@host/x"
    assert redact_text("http://u:@h/") == f"http://u:{REDACTED}@h/"
    assert redact_text("redis://:pw@h:6379") == f"redis://:{REDACTED}@h:6379"
    assert url_password("http://u@h/") is None and url_password("x://u:pw@h") == "pw"


def test_log_formatter_redacts_every_line():
    fmt = RedactingFormatter(logging.Formatter("%(message)s"))
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "a token=1\nb password=2\nc", None, None)
    assert fmt.format(rec) == f"a token={REDACTED}\nb password={REDACTED}\nc"


def test_urls_for_messages():
    from hangd.redact import redact_url

    assert redact_url("postgresql://hangd:pw@db:5432/hangd") == f"postgresql://hangd:{REDACTED}@db:5432/hangd"
    assert redact_url("sqlite:////var/lib/hangd/hangd.db") == "sqlite:////var/lib/hangd/hangd.db"
