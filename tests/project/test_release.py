"""The release is written once (megatron_musa_patch/base/version.py): the package, ``mmp --version``,
the installed metadata and ``mmp doctor`` say the same; the licence setup.py declares ships."""

import re
import subprocess
import sys
from importlib.metadata import version as installed_version

from megatron_musa_patch import __version__
from megatron_musa_patch.cli.main import main

from tests.conftest import REPO


def test_one_version_everywhere(capsys):
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mmp (megatron-musa-patch) {__version__}"
    # what pip installed from setup.py, which reads the same file
    assert installed_version("megatron-musa-patch") == __version__
    setup = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO,
                           capture_output=True, text=True, check=True)
    assert setup.stdout.strip().splitlines()[-1] == __version__
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## [{__version__}]" in changelog


def test_the_declared_licence_ships():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license="Apache-2.0"' in (REPO / "setup.py").read_text()
    assert "LICENSE" in (REPO / "MANIFEST.in").read_text()
