"""`doctor` tells how mcp-interp was installed from the distribution's own metadata files (PEP 610 direct_url.json,
PEP 376 INSTALLER) and gives the matching fix. Each case is a hand-made .dist-info folder read by importlib.metadata's
real reader, as pip and uv write them (the layouts below were copied from `pip install` and `uv pip install` of the
built wheel into fresh venvs)."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest

from mcp_interp.app.doctor import Install, detect_install


def fake_dist(tmp_path: Path, installer: str | None, direct_url: dict | None) -> metadata.Distribution:
    info = tmp_path / "site-packages" / "mcp_interp-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: mcp-interp\nVersion: 0.1.0\n")
    if installer is not None:
        (info / "INSTALLER").write_text(installer + "\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return metadata.PathDistribution(info)


WHEEL_URL = {"url": "file:///tmp/dist/mcp_interp-0.1.0-py3-none-any.whl", "archive_info": {}}


def test_an_editable_checkout_is_fixed_with_run_setup(tmp_path: Path) -> None:
    dist = fake_dist(tmp_path, "pip", {"url": "file:///home/me/mcp-interp", "dir_info": {"editable": True}})
    install = detect_install(dist, prefix=tmp_path)
    assert install == Install("editable", "/home/me/mcp-interp")
    assert install.package_fix() == "cd /home/me/mcp-interp && ./run setup  (or: pip install -e /home/me/mcp-interp)"
    assert install.embedded_fix() == "mcp-interp setup  (or: ./run setup)"


def test_a_pip_installed_wheel_is_fixed_with_pip_and_the_same_wheel(tmp_path: Path) -> None:
    install = detect_install(fake_dist(tmp_path, "pip", WHEEL_URL), prefix=tmp_path)
    assert install == Install("pip", "/tmp/dist/mcp_interp-0.1.0-py3-none-any.whl")
    assert install.package_fix() == (
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
        " && pip install /tmp/dist/mcp_interp-0.1.0-py3-none-any.whl"
    )
    assert install.package_note() == (
        "where pip's configuration already provides torch's CPU wheel (`pip config list`), plain "
        "`pip install torch==2.13.0` works"
    )
    assert install.embedded_fix() == "mcp-interp setup"


def test_a_pip_install_from_the_index_names_the_package(tmp_path: Path) -> None:
    install = detect_install(fake_dist(tmp_path, "pip", None), prefix=tmp_path)
    assert install == Install("pip", "mcp-interp")
    assert install.package_fix() == (
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install mcp-interp"
    )


def test_a_git_install_is_fixed_with_the_same_commit(tmp_path: Path) -> None:
    direct = {"url": "https://example.org/mcp-interp.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}}
    install = detect_install(fake_dist(tmp_path, "pip", direct), prefix=tmp_path)
    assert install.package_fix() == (
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
        " && pip install git+https://example.org/mcp-interp.git@abc123"
    )


def test_uv_pip_into_a_venv_is_fixed_with_uv_pip(tmp_path: Path) -> None:
    install = detect_install(fake_dist(tmp_path, "uv", WHEEL_URL), prefix=tmp_path)
    assert install == Install("uv", "/tmp/dist/mcp_interp-0.1.0-py3-none-any.whl")
    assert install.package_fix() == (
        f"uv pip install --python {sys.executable} --torch-backend cpu torch==2.13.0"
        " /tmp/dist/mcp_interp-0.1.0-py3-none-any.whl"
    )
    assert install.package_note() == ""
    assert install.embedded_fix() == "mcp-interp setup"


def test_a_uv_tool_is_reinstalled_with_uv_tool_install(tmp_path: Path) -> None:
    prefix = tmp_path / "tools" / "mcp-interp"
    prefix.mkdir(parents=True)
    (prefix / "uv-receipt.toml").write_text("[tool]\n")
    install = detect_install(fake_dist(tmp_path, "uv", WHEEL_URL), prefix=prefix)
    assert install == Install("uv-tool", "/tmp/dist/mcp_interp-0.1.0-py3-none-any.whl")
    wheel = "/tmp/dist/mcp_interp-0.1.0-py3-none-any.whl"
    assert install.package_fix() == f"uv tool install --reinstall --torch-backend cpu --with torch==2.13.0 {wheel}"
    assert install.embedded_fix() == "mcp-interp setup"  # the tool's own command is on PATH


def test_a_uvx_environment_is_fixed_with_uvx_lines_that_return(tmp_path: Path) -> None:
    prefix = tmp_path / "cache" / "uv" / "archive-v0" / "NqdiLoGIi4GlDzH6"
    install = detect_install(fake_dist(tmp_path, "uv", WHEEL_URL), prefix=prefix)
    assert install == Install("uvx", "/tmp/dist/mcp_interp-0.1.0-py3-none-any.whl")
    wheel = "/tmp/dist/mcp_interp-0.1.0-py3-none-any.whl"
    # never `… mcp-interp serve`: a repair command must finish, not wait on stdin as a server
    assert install.package_fix() == f"uvx --torch-backend cpu --with torch==2.13.0 --from {wheel} mcp-interp doctor"
    assert install.embedded_fix() == f"uvx --torch-backend cpu --with torch==2.13.0 --from {wheel} mcp-interp setup"


def test_the_repos_own_environment_is_read_for_real() -> None:
    """This test runs from an editable checkout (./run setup): its real metadata says so."""
    install = detect_install()
    assert install.mode in ("editable", "checkout")
    assert (Path(install.source) / "pyproject.toml").is_file()


def test_doctor_prints_the_pip_note_beside_the_cpu_fix(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A missing package stops doctor before any model loads: its lines carry the fix, the torch remark and the
    note."""
    from mcp_interp.app import doctor

    monkeypatch.setattr(doctor, "detect_install", lambda: Install("pip", "mcp-interp"))
    monkeypatch.setattr(doctor, "REQUIRED", ("torch", "no_such_module_here"))
    assert doctor.run_doctor("smollm2-135m") == 1
    out = capsys.readouterr().out
    fix = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install mcp-interp"
    note = "where pip's configuration already provides torch's CPU wheel (`pip config list`), plain `pip install"
    assert f"repair with `{fix}` ({note} torch==2.13.0` works)" in out
    assert f"  MISSING no_such_module_here: fix with `{fix}`\n" in out
    assert f"Some packages are missing; `{fix}` installs all of them ({note}" in out
