import pytest

from kog_lsp.cli import build_parser
from kog_lsp.settings import Settings


def test_defaults_match_contract():
    d = Settings().to_dict()
    expected = {"enable": True, "debounceMs": 50, "maxTokens": 64, "multiline": "auto", "prefixTokens": 1024,
                "suffixTokens": 64, "contextTokens": 512, "temperature": 0.0, "reviewEnable": True,
                "reviewSeverity": "information"}
    # (feature modules may register more keys in the same process; the contract's keys must be exact)
    assert {k: d.get(k) for k in expected} == expected


def test_register_setting():
    from kog_lsp.settings import _VALIDATORS, register_setting

    s = Settings()

    def check(v):
        if not isinstance(v, str):
            raise ValueError("expected a string")
        return v

    try:
        assert register_setting(s, "testOnlyKey", "test_only_key", check, "x")
        assert not register_setting(s, "maxTokens", "max_tokens", check, 1)
        assert s.update({"testOnlyKey": "y"}) == [] and s.test_only_key == "y" and s.to_dict()["testOnlyKey"] == "y"
        assert s.update({"testOnlyKey": 3}) and s.test_only_key == "y"
    finally:
        _VALIDATORS.pop("testOnlyKey", None)


def test_update_applies_valid_and_keeps_old_on_invalid():
    s = Settings()
    warnings = s.update({"debounceMs": 0, "maxTokens": -3, "multiline": "sometimes", "temperature": 0.5,
                         "enable": "yes", "reviewSeverity": "hint", "bogus": 1})
    assert s.debounce_ms == 0 and s.temperature == 0.5 and s.review_severity == "hint"
    assert s.max_tokens == 64 and s.multiline == "auto" and s.enable is True
    joined = "\n".join(warnings)
    for key in ("maxTokens", "multiline", "enable", "bogus"):
        assert key in joined
    assert len(warnings) == 4


def test_update_accepts_wrapped_section_and_rejects_bool_as_int():
    s = Settings()
    assert s.update({"kog": {"prefixTokens": 64}}) == []
    assert s.prefix_tokens == 64
    assert s.update({"suffixTokens": True}) and s.suffix_tokens == 64
    assert s.update("nonsense") and s.prefix_tokens == 64
    assert s.update(None) == []


def test_cli_parsing():
    p = build_parser()
    a = p.parse_args([])
    assert (a.model, a.device, a.backend, a.tp, a.tp_mode, a.tcp, a.command) == ("default", "auto", "auto", 1,
                                                                                 "exact", None, None)
    a = p.parse_args(["--tcp", "127.0.0.1:2087", "--model", "/m", "--device", "cpu", "--backend", "reference",
                      "--tp", "2", "--tp-mode", "delayed", "--log-file", "/tmp/x.log"])
    assert a.tcp == ("127.0.0.1", 2087) and a.tp == 2 and a.tp_mode == "delayed" and a.log_file == "/tmp/x.log"
    a = p.parse_args(["demo", "--model", "/m", "--speed", "3", "--backend", "reference"])
    assert a.command == "demo" and a.model == "/m" and a.speed == 3.0 and a.backend == "reference"
    for bad in (["--tcp", "nohost"], ["--tp", "0"], ["--device", "tpu"], ["--stdio", "--tcp", ":1"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_engine_threads_default_leaves_the_editor_cores():
    from kog_lsp.cli import engine_threads

    assert [engine_threads(None, c) for c in (1, 2, 4, 8, 64)] == [1, 1, 2, 4, 4]
    assert engine_threads(0, 8) is None and engine_threads(3, 2) == 3
    assert build_parser().parse_args([]).threads is None
    assert build_parser().parse_args(["--threads", "0"]).threads == 0


def test_cli_version(capsys):
    from kog_lsp import __version__

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--version"])
    assert e.value.code == 0
    assert __version__ in capsys.readouterr().out
