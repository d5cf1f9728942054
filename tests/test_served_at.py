"""Where the night finds the live model server (core.model.served_at): the recorded URL of
the bot's server after a swap, else the configured one; never a file's foreign URL."""

from __future__ import annotations

from core.config import Config
from core.model.served_at import path, record, served_url


def config(tmp_path, **server) -> Config:
    return Config.model_validate({"paths": {"data_dir": str(tmp_path)},
                                  "server": {"port": 8080, **server}})


def test_the_recorded_url_wins_over_the_configured_port(tmp_path):
    c = config(tmp_path)
    assert served_url(c) == c.base_url == "http://127.0.0.1:8080/v1"  # nothing recorded yet
    record(tmp_path, "http://127.0.0.1:45123/v1")
    assert served_url(c) == "http://127.0.0.1:45123/v1"
    assert [p.name for p in path(tmp_path).parent.iterdir()] == ["served-url"]  # no part file


def test_a_foreign_or_broken_record_is_ignored(tmp_path):
    c = config(tmp_path)
    for text in ("http://evil.example:80/v1", "garbage", "", "http://127.0.0.1:45123/other"):
        record(tmp_path, text)
        assert served_url(c) == c.base_url, text
    path(tmp_path).write_bytes(b"\xff\xfe")
    assert served_url(c) == c.base_url


def test_an_external_server_is_where_it_is_configured(tmp_path):
    c = config(tmp_path, kind="external", endpoint="http://10.0.0.5:9000/v1")
    record(tmp_path, "http://127.0.0.1:45123/v1")
    assert served_url(c) == "http://10.0.0.5:9000/v1"
