"""scripts/install.sh as a new Mac user meets it, with stubs on PATH in place of the Mac.

Each test copies the script into a temporary checkout and runs it with PATH holding only stub programs (python3,
python3.12, uv, uname, sw_vers, sysctl) and the few system tools the script uses, so the host's own Pythons are out of
reach. A stub Python answers the script's version probe and makes a `.venv` whose `bin/python` is a copy of itself
and whose `bin/pip` only logs its arguments: nothing is downloaded or installed, each run takes milliseconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("bash", "dirname", "rm", "cp", "mkdir", "chmod", "grep", "id", "cat", "tail")


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@dataclass
class Mac:
    """A temporary checkout and a PATH of stubs standing for one machine."""

    root: Path
    bin: Path
    pip_log: Path

    def python(self, name: str, version: str, machine: str = "arm64") -> Path:
        """A stub interpreter: prints `version machine` to any -c probe, makes a .venv of itself for -m venv."""
        path = self.bin / name
        _script(
            path,
            f'if [ "$1" = -c ]; then echo "{version} {machine}"; exit 0; fi\n'
            'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
            f'  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && printf \'#!/bin/bash\\necho "$@" >> {self.pip_log}\\n\''
            ' > "$3/bin/pip" && chmod +x "$3/bin/pip"; exit $?\n'
            "fi\nexit 1\n",
        )
        return path

    def system(self, os_name: str = "Darwin", machine: str = "arm64", macos: str = "15.1", translated: str = "0") -> None:
        _script(self.bin / "uname", f'[ "$1" = -m ] && echo {machine} || echo {os_name}\n')
        _script(self.bin / "sw_vers", f"echo {macos}\n")
        # Intel Macs have no sysctl.proc_translated: the stub fails as sysctl does there.
        _script(self.bin / "sysctl", f"echo {translated}\n" if translated else "exit 1\n")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": str(self.bin), "HOME": str(self.root)}
        return subprocess.run(
            ["bash", str(self.root / "scripts" / "install.sh"), *args],
            cwd=self.root, env=env, capture_output=True, text=True, timeout=60,
        )

    def venv_python(self) -> str:
        probe = subprocess.run(
            [str(self.root / ".venv" / "bin" / "python"), "-c", "probe"], capture_output=True, text=True, check=True
        )
        return probe.stdout.strip()


@pytest.fixture
def mac(tmp_path: Path) -> Mac:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", root / "scripts" / "install.sh")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        os.symlink(found, stubs / tool)
    machine = Mac(root, stubs, tmp_path / "pip.log")
    machine.system()
    return machine


def test_a_stock_python3_of_39_is_passed_over_for_python312(mac: Mac):
    mac.python("python3", "3.9")  # the Command Line Tools' /usr/bin/python3 is 3.9.6
    mac.python("python3.12", "3.12")  # brew install python@3.12
    done = mac.run()
    assert done.returncode == 0, done.stderr
    assert mac.venv_python() == "3.12 arm64"
    assert "install -q -e ." in mac.pip_log.read_text()


def test_with_only_39_and_no_uv_it_stops_in_one_line_saying_what_to_install(mac: Mac):
    mac.python("python3", "3.9")
    done = mac.run()
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "3.11 or later" in lines[0] and "python3 is 3.9" in lines[0] and "brew install python@3.12" in lines[0]
    assert not (mac.root / ".venv").exists() and not mac.pip_log.exists()


def test_uv_provides_the_python_when_none_on_path_will_do(mac: Mac):
    mac.python("python3", "3.9")
    managed = mac.python("uv-cpython-3.12", "3.12")
    _script(mac.bin / "uv", f'[ "$1 $2" = "python find" ] && echo {managed}\n')
    done = mac.run()
    assert done.returncode == 0, done.stderr
    assert mac.venv_python() == "3.12 arm64"


def test_a_venv_made_by_an_unusable_python_is_rebuilt(mac: Mac):
    old = mac.python("python3", "3.9")
    subprocess.run([str(old), "-m", "venv", str(mac.root / ".venv")], check=True)  # the first, failed install
    assert mac.venv_python() == "3.9 arm64"
    mac.python("python3.11", "3.11")
    done = mac.run()
    assert done.returncode == 0, done.stderr
    assert "rebuilding .venv" in done.stderr
    assert mac.venv_python() == "3.11 arm64"


def test_a_rosetta_python_is_not_used(mac: Mac):
    mac.python("python3.12", "3.12", machine="x86_64")  # an Intel Homebrew under /usr/local
    mac.python("python3", "3.9")
    done = mac.run()
    assert done.returncode == 2 and "arm64 Python 3.11" in done.stderr and "x86_64" in done.stderr


@pytest.mark.parametrize(
    ("machine", "translated", "macos", "said"),
    [
        ("x86_64", "", "14.5", "Apple silicon"),  # an Intel Mac
        ("x86_64", "1", "15.1", "Rosetta (x86_64): MLX needs Apple silicon"),  # shell translated
        ("arm64", "0", "13.6.1", "macOS 14"),
    ],
)
def test_a_mac_mlx_cannot_run_on_is_told_in_one_line(mac: Mac, machine: str, translated: str, macos: str, said: str):
    mac.system(machine=machine, translated=translated, macos=macos)
    mac.python("python3.12", "3.12")
    done = mac.run()
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and said in done.stderr
    assert not (mac.root / ".venv").exists()


def test_the_test_extra_installs_the_coding_agents_with_npm_into_the_venv(mac: Mac):
    mac.python("python3.12", "3.12")
    npm_log = mac.root.parent / "npm.log"
    _script(mac.bin / "npm", f'echo "$@" >> {npm_log}\n')
    assert mac.run().returncode == 0 and not npm_log.exists(), "without the test extra, no agents"
    done = mac.run("test")
    assert done.returncode == 0, done.stderr
    install = npm_log.read_text().splitlines()[0]
    assert install.startswith("install --prefix .venv/agents ")
    assert all(f"{package}@latest" in install.split() for package in
               ("@anthropic-ai/claude-code", "@openai/codex", "@qwen-code/qwen-code", "opencode-ai"))


def test_without_npm_the_test_extra_says_the_agent_tests_skip(mac: Mac):
    mac.python("python3.12", "3.12")
    done = mac.run("test")
    assert done.returncode == 0, done.stderr
    assert "no npm" in done.stderr and "test_agents.py skips" in done.stderr
