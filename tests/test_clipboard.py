"""The copy's notice says how the text went, and "Copied" only when a clipboard command said it copied."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.tui import clipboard


@pytest.fixture
def mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(clipboard, "PLATFORM", "darwin")
    monkeypatch.setenv("PATH", str(tmp_path))
    for name in ("SSH_TTY", "SSH_CONNECTION", "SSH_CLIENT", "TERM_PROGRAM"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_a_failing_pbcopy_falls_back_to_osc52_and_says_so(mac: Path):
    (mac / "pbcopy").write_text("#!/bin/sh\necho 'no pasteboard' >&2\nexit 1\n")
    (mac / "pbcopy").chmod(0o755)
    sent: list[str] = []
    copied = clipboard.copy_text("hi", sent.append)
    assert sent == ["hi"] and not copied.done and "pbcopy failed (no pasteboard)" in copied.why
    line, warning = clipboard.copy_notice(copied, "the last reply", 2)
    assert warning and "OSC 52" in line and not line.startswith("Copied")


def test_in_terminal_app_without_pbcopy_nothing_is_copied_and_the_notice_says_so(mac: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TERM_PROGRAM", "Apple_Terminal")
    sent: list[str] = []
    line, warning = clipboard.copy_notice(clipboard.copy_text("hi", sent.append), "the last reply", 2)
    assert sent == [] and warning and line.startswith("Nothing was copied: Terminal.app ignores OSC 52")


def test_linux_uses_wl_copy_or_xclip_where_a_display_is(mac: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(clipboard, "PLATFORM", "linux")
    (mac / "xclip").write_text("#!/bin/sh\nexit 0\n")
    (mac / "xclip").chmod(0o755)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    assert clipboard.clipboard_command() == ["xclip", "-selection", "clipboard"]
    monkeypatch.delenv("DISPLAY")
    assert clipboard.clipboard_command() is None
