from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from hangd.config import DEFAULT_PORT, ConfigError, Settings, load_settings

from .conftest import ROOT, hangd_cmd, run_hangd


def test_defaults_and_precedence(tmp_path):
    cfg = tmp_path / "hangd.toml"
    cfg.write_text('interval = 2.5\nlisten = "127.0.0.1:9999"\n')
    s = load_settings(flags={}, env={}, config_path=str(cfg))
    assert s.interval == 2.5 and s.listen == "127.0.0.1:9999"
    s = load_settings(flags={}, env={"HANGD_INTERVAL": "3"}, config_path=str(cfg))
    assert s.interval == 3.0
    s = load_settings(flags={"interval": 0.5}, env={"HANGD_INTERVAL": "3"}, config_path=str(cfg))
    assert s.interval == 0.5
    assert load_settings(flags={}, env={}).listen == f"127.0.0.1:{DEFAULT_PORT}"


@pytest.mark.parametrize("flags,env,msg", [
    ({"interval": "fast"}, {}, "--interval"),
    ({}, {"HANGD_INTERVAL": "-1"}, "HANGD_INTERVAL"),
    ({"listen": "nowhere"}, {}, "listen"),
    ({}, {"HANGD_NVML": "maybe"}, "HANGD_NVML"),
])
def test_bad_values_name_what_is_wrong(flags, env, msg):
    with pytest.raises(ConfigError, match=msg):
        load_settings(flags=flags, env=env)


def test_bad_file(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text("interval = [1,\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(flags={}, env={}, config_path=str(p))
    p.write_text("bogus = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        load_settings(flags={}, env={}, config_path=str(p))


def test_cli_errors_are_one_line_exit_2(tmp_path):
    for args in (["status", "--bogus"], ["--config", str(tmp_path / "none.toml"), "status"],
                 ["record", "--out", str(tmp_path / "x"), "--hz", "0"], ["nosuchcommand"]):
        out = run_hangd(*args, check=False)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_status_runs_here_without_gpus(monkeypatch):
    # 3: no GPU visible and no job on this host (tests/test_cli.py pins the blind node's words). A job
    # is what has this test's own variable: one that another test (another pytest-xdist worker) runs
    # here meanwhile, with a torch.distributed environment, would make it 4
    monkeypatch.setenv("HANGD_JOB_ENV", f"HANGD_TEST_JOB_{uuid.uuid4().hex[:8]}")
    out = run_hangd("status", "--seconds", "1", check=False)
    assert out.returncode in (0, 1, 3), out.stderr
    assert "GPUs cannot be seen" in out.stdout or "GPU" in out.stdout
    import json
    doc = json.loads(run_hangd("status", "--json", "--seconds", "1", check=False).stdout)
    assert set(doc) >= {"gpus", "processes", "jobs", "unavailable"}


@pytest.mark.parametrize("flags,env,msg", [
    ({"interval": "nan"}, {}, "--interval"),
    ({"interval": 1e-9}, {}, "--interval"),
    ({"interval": "inf"}, {}, "--interval"),
    ({}, {"HANGD_HANG_GPU_S": "nan"}, "HANGD_HANG_GPU_S"),
    ({}, {"HANGD_HANG_HOST_S": "-3"}, "HANGD_HANG_HOST_S"),
    ({}, {"HANGD_RETENTION_DAYS": "nan"}, "HANGD_RETENTION_DAYS"),
    ({}, {"HANGD_LOG_LEVEL": "bogus"}, "HANGD_LOG_LEVEL"),
    ({}, {"HANGD_TOKEN": "   "}, "HANGD_TOKEN"),
    ({}, {"HANGD_PYSPY_TIMEOUT": "1e400"}, "HANGD_PYSPY_TIMEOUT"),
])
def test_every_setting_is_finite_and_in_range(flags, env, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        load_settings(flags=flags, env=env)
    assert "\n" not in str(e.value)


def test_a_token_is_never_echoed_in_an_error():
    with pytest.raises(ConfigError) as e:
        load_settings(flags={}, env={"HANGD_TOKEN": " \t "})
    assert "\t" not in str(e.value) and "value not shown" in str(e.value)


def test_bad_files_are_one_line(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text("interval = [1, 2]\n")
    with pytest.raises(ConfigError, match="interval"):
        load_settings(flags={}, env={}, config_path=str(p))
    p.write_bytes(b'log_level = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(flags={}, env={}, config_path=str(p))
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(flags={}, env={}, config_path=str(tmp_path))
    tok = tmp_path / "token"
    tok.write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        load_settings(flags={"token_file": str(tok)}, env={}).resolved_token()


def test_a_fifo_as_config_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    out = run_hangd("--config", str(fifo), "status", check=False, timeout=30)
    assert out.returncode == 2 and "not a regular file" in out.stderr, out.stderr


@pytest.mark.parametrize("args", [
    ["watch", "--interval", "nan"],
    ["watch", "--interval", "1e-9"],
    ["watch", "--interval", "inf"],
    ["status", "--seconds", "-1"],
    ["status", "--seconds", "nan"],
    ["replay", "tests/data/traces/h200x2/idle_server", "--speed", "-2"],
    ["record", "--out", "/proc/x", "--seconds", "0.2"],
    ["db", "upgrade", "nosuchrev", "--db", "sqlite:///{tmp}/u.db"],
    ["db", "downgrade", "nosuchrev", "--db", "sqlite:///{tmp}/d.db"],
    ["serve", "--interval", "nan"],
    ["serve", "--listen", "127.0.0.1:99999"],
])
def test_cli_refuses_bad_values_in_one_line(tmp_path, args):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = run_hangd(*args, check=False, timeout=60)
    assert out.returncode == 2, (args, out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("env", [{"HANGD_HANG_GPU_S": "nan"}, {"HANGD_RETENTION_DAYS": "nan"},
                                 {"HANGD_LOG_LEVEL": "bogus"}, {"HANGD_TOKEN": "  "}])
def test_serve_refuses_bad_environment_in_one_line(tmp_path, env):
    out = subprocess.run([*hangd_cmd(), "serve", "--db", f"sqlite:///{tmp_path / 'x.db'}"], cwd=ROOT,
                         env=dict(os.environ, **env), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert next(iter(env)) in out.stderr


def test_layering_is_pydantic_settings_flags_then_environment_then_file(tmp_path, monkeypatch):
    from pydantic_settings import BaseSettings

    from hangd.config import Settings

    assert issubclass(Settings, BaseSettings)  # the library layers; hangd only reads the file safely
    cfg = tmp_path / "hangd.toml"
    cfg.write_text('job_env = ["FROM_FILE"]\nnvml = false\ninterval = 2\n')
    s = load_settings(flags={}, env={"HANGD_JOB_ENV": "A, B", "HANGD_INTERVAL": ""}, config_path=str(cfg))
    assert s.job_env == ["A", "B"]  # a comma list in the environment, not JSON
    assert s.nvml is False and s.interval == 2.0  # from the file; an empty variable is unset
    # a value is named by the layer it came from
    with pytest.raises(ConfigError, match=r"^config file .*hangd.toml: interval: 'x': "):
        cfg.write_text('interval = "x"\n')
        load_settings(flags={}, env={}, config_path=str(cfg))
    # Settings(...) in code is exactly what it is given: the host's variables are load_settings' business
    monkeypatch.setenv("HANGD_INTERVAL", "7")
    assert Settings().interval == 1.0 and load_settings(flags={}, config_path=os.devnull).interval == 7.0


def test_the_settings_defaults_are_the_analysis_defaults_and_reach_it():
    from hangd.analysis.thresholds import Thresholds
    from hangd.daemon import thresholds_from
    from hangd.store.db import NODE_STALE_S

    th, s = Thresholds(), Settings()
    for name in ("hang_gpu_s", "hang_host_s", "hang_io_s", "gone_after_s", "node_stale_s"):
        assert getattr(s, name) == getattr(th, name), name
    assert NODE_STALE_S == th.node_stale_s
    got = thresholds_from(Settings(gone_after_s=7.0, node_stale_s=9.0))
    assert (got.gone_after_s, got.node_stale_s) == (7.0, 9.0)
