"""The quickstart's environment step (examples/quickstart/environment.sh): pip's package sources
handed to uv (pip_to_uv.py), the lean install into a new venv, and an existing venv left on its
releases. uv is a stand-in here that records what it is asked (the real one needs the network);
the quickstart's own run with the real uv is timed by hand (docs/getting-started.md)."""

import importlib.util
import os
import shutil
import subprocess

from tests.conftest import REPO, subprocess_env

SCRIPT = REPO / "examples" / "quickstart" / "environment.sh"
_spec = importlib.util.spec_from_file_location("pip_to_uv", SCRIPT.with_name("pip_to_uv.py"))
pip_to_uv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pip_to_uv)  # an example's script, not a package module

LISTING = """\
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/opt/wheels'
global.index-url='https://mirror.example/simple'
global.constraint='/etc/xdg/pip/constraints.txt'
user.find-links='/home/u/wheels'
:env:.index-url='https://env.example/simple'
global.cert='/etc/ssl/certs/ca.crt'
global.trusted-host='mirror.example'
"""


def test_pip_sources_become_uv_options():
    config = pip_to_uv.read_config(LISTING)
    # the winning scope: environment over user over global; pip's constraints are not taken
    assert config["index-url"] == "https://env.example/simple"
    assert config["find-links"] == "/home/u/wheels"
    assert pip_to_uv.uv_options(config) == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://env.example/simple",
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/home/u/wheels",
        "--allow-insecure-host", "mirror.example",
        "env SSL_CERT_FILE=/etc/ssl/certs/ca.crt",
    ]
    assert pip_to_uv.uv_options({}) == ["--index-strategy", "unsafe-best-match"]
    assert "--no-index" in pip_to_uv.uv_options({"no-index": "true"})


def fake_tools(tmp_path, has_packages: bool):
    """A uv that logs its arguments and makes a venv whose python answers the package check."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "uv.log"
    python = "#!/bin/sh\nexit {}\n".format(0 if has_packages else 1)
    (bin_dir / "uv").write_text(f"""#!/bin/sh
echo "$@" >> {log}
if [ "$1" = venv ]; then
  for last; do :; done
  mkdir -p "$last/bin" && printf '{python}' > "$last/bin/python" && chmod +x "$last/bin/python"
fi
""")
    (bin_dir / "uv").chmod(0o755)
    return bin_dir, log


# the script's own inputs: CI's 3.12 leg sets PYTHON (a real interpreter, which would install a
# real uv) and TORCH_VERSION; each test names the ones it means
SCRIPT_INPUTS = ("PYTHON", "TORCH_VERSION", "UV_VERSION", "MMP_CACHE_DIR", "XDG_CACHE_HOME")


def run_script(venv, **overrides):
    env = {k: v for k, v in subprocess_env().items() if k not in SCRIPT_INPUTS}
    env.update(overrides)
    return subprocess.run([shutil.which("bash"), str(SCRIPT), str(venv)], env=env,
                          capture_output=True, text=True, timeout=120)


def environment(tmp_path, bin_dir, venv):
    return run_script(venv, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                      PIP_CONFIG_FILE=os.devnull,  # this machine's pip.conf left out
                      PIP_FIND_LINKS="/w", PIP_EXTRA_INDEX_URL="file:///x/simple",
                      MMP_CACHE_DIR=str(tmp_path / "cache"))


def tools_without_uv(tmp_path):
    """A PATH folder with just the commands the script and the stand-in Python run: a machine's
    own uv (CI images may have one in /usr/bin) stays out of reach."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("dirname", "mkdir", "cp", "rm", "mv"):
        (tools / name).symlink_to(shutil.which(name))
    return tools


def test_a_new_venv_gets_the_lean_set_from_pips_sources(tmp_path):
    bin_dir, log = fake_tools(tmp_path, has_packages=False)
    venv = tmp_path / "venv"
    proc = environment(tmp_path, bin_dir, venv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    make, install = log.read_text().splitlines()
    sources = ("--index-strategy unsafe-best-match --extra-index-url file:///x/simple "
               "--find-links /w")
    assert make.startswith("venv --quiet --seed --python /") and make.endswith(
        f"{sources} {venv}")
    assert install == (f"pip install --quiet --python {venv}/bin/python {sources} --constraint "
                       f"{REPO}/scripts/constraints.txt torch==2.13.0 {REPO}[training,data]")
    assert not (tmp_path / "cache").exists()  # the uv on PATH: none installed


def test_an_equipped_venv_only_gets_this_checkouts_package(tmp_path):
    bin_dir, log = fake_tools(tmp_path, has_packages=True)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv / "bin" / "python").chmod(0o755)
    proc = environment(tmp_path, bin_dir, venv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reinstalling only this checkout's package" in proc.stdout
    (install,) = log.read_text().splitlines()
    assert install.startswith(f"pip install --quiet --python {venv}/bin/python ")
    assert install.endswith(f"--no-deps --reinstall-package megatron-musa-patch {REPO}")
    assert "torch==" not in install and "--constraint" not in install


def test_without_uv_it_falls_back_to_venv_and_pip(tmp_path):
    """No uv on PATH and pip cannot install one (no index for it): python -m venv and pip
    install the same lean set, under the project's constraints."""
    bin_dir, log = tmp_path / "bin", tmp_path / "python.log"
    bin_dir.mkdir()
    # a Python that logs its arguments; -m venv makes a venv of the same kind; the pip install of
    # uv fails, the package check fails (a new venv has nothing), everything else succeeds
    (bin_dir / "python3").write_text(f"""#!/bin/sh
echo "$0 $@ PIP_CONSTRAINT=$PIP_CONSTRAINT" >> {log}
case "$*" in
  *sys.executable*) echo "$0" ;;
  *"--target"*) exit 1 ;;
  *find_spec*) exit 1 ;;
  "-m venv "*) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
esac
""")
    (bin_dir / "python3").chmod(0o755)
    venv = tmp_path / "venv"
    proc = run_script(venv, PATH=f"{bin_dir}{os.pathsep}{tools_without_uv(tmp_path)}",
                      MMP_CACHE_DIR=str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "uv 0.13.9 could not be installed (above): python -m venv and pip instead" in \
        proc.stdout
    calls = log.read_text().splitlines()
    assert any(" -m venv " in c for c in calls)
    assert calls[-1] == (f"{venv}/bin/python -m pip install --quiet torch==2.13.0 "
                         f"{REPO}[training,data] PIP_CONSTRAINT={REPO}/scripts/constraints.txt")
    assert not (tmp_path / "cache" / "uv-0.13.9").exists()  # nothing half-installed is kept
