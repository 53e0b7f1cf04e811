"""Client-named paths (``mcp_interp.state.paths``): read only inside the allowed roots, refused outside them with one
message whether or not the path exists; symlinks and ``~`` resolved before the check; over HTTP no root by default.
The tools that take a path (``sae``, ``transcoders``) give no existence oracle outside the roots either."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

import mcp_interp.state.limits as limits
import mcp_interp.state.paths as paths
from mcp_interp.app import cli
from mcp_interp.core.engine.dictionaries.saelens import resolve_folder
from mcp_interp.core.engine.dictionaries.transcoder_format import resolve_source
from mcp_interp.errors import InputError
from tests.features.test_sae import random_weights, write_sae
from tests.helpers import assert_valid_structured, error_text, tools_by_name
from tests.transport.test_http import start as start_http  # one way to start the HTTP server

OUTSIDE = "names a path outside the folders this server may read"


@pytest.fixture
def roots(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Let a test set the process-wide roots; they are put back afterwards."""
    monkeypatch.setattr(paths, "_roots", paths._roots)
    yield


@pytest.fixture
def layout(tmp_path: Path, roots: None) -> dict[str, Path]:
    """One allowed root holding a file, a symlink to a file outside and a symlink to a folder outside; beside it an
    outside folder holding a real file."""
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "inside.txt").write_text("inside")
    (outside / "secret.txt").write_text("secret")
    (root / "link-to-secret").symlink_to(outside / "secret.txt")
    (root / "link-to-outside").symlink_to(outside, target_is_directory=True)
    paths.configure([root])
    return {"root": root.resolve(), "outside": outside.resolve()}


def refusal(value: str, argument: str = "sae") -> str:
    with pytest.raises(InputError) as caught:
        paths.client_path(value, argument)
    return str(caught.value)


def test_an_existing_and_a_missing_path_outside_the_roots_get_the_same_refusal(layout: dict[str, Path]) -> None:
    outside = layout["outside"]
    existing_file, missing_file = refusal(str(outside / "secret.txt")), refusal(str(outside / "missing.txt"))
    existing_dir, missing_dir = refusal(str(outside)), refusal(str(outside.parent / "no-such-folder"))
    assert existing_file == missing_file == existing_dir == missing_dir
    assert OUTSIDE in existing_file and f"allowed roots: {layout['root']})" in existing_file
    assert "--allow-root DIR" in existing_file
    for name in ("secret.txt", "missing.txt", "no-such-folder", "elsewhere"):
        assert name not in existing_file  # the refusal does not echo (or resolve) what it was asked for
    assert refusal("/etc/passwd") == refusal("/etc/no-such-file-here") == existing_file


def test_a_symlink_inside_a_root_pointing_outside_is_refused(layout: dict[str, Path]) -> None:
    root = layout["root"]
    expected = refusal(str(layout["outside"] / "missing.txt"))
    assert refusal(str(root / "link-to-secret")) == expected
    assert refusal(str(root / "link-to-outside")) == expected
    assert refusal(str(root / "link-to-outside" / "secret.txt")) == expected
    assert refusal(str(root / "sub" / ".." / ".." / "elsewhere" / "secret.txt")) == expected  # `..` out of the root


def test_a_path_inside_a_root_resolves(layout: dict[str, Path]) -> None:
    root = layout["root"]
    assert paths.client_path(str(root / "sub" / "inside.txt"), "sae") == root / "sub" / "inside.txt"
    assert paths.client_path(str(root), "sae") == root
    assert paths.client_path(str(root / "sub" / ".." / "sub"), "sae") == root / "sub"
    # A missing path inside a root resolves too (the tool then says what is missing, which the caller may know).
    assert paths.client_path(str(root / "not-yet"), "sae") == root / "not-yet"
    (root / "inner-link").symlink_to(root / "sub")
    assert paths.client_path(str(root / "inner-link" / "inside.txt"), "sae") == root / "sub" / "inside.txt"
    # A sibling whose name starts with the root's is not inside it.
    (root.parent / "root-sibling").mkdir()
    assert OUTSIDE in refusal(str(root.parent / "root-sibling"))


def test_tilde_expands_to_home_and_does_not_escape(
    layout: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    expected = refusal(str(layout["outside"] / "missing.txt"))
    # home is outside the root: `~` reaches it, and is refused
    assert refusal("~") == refusal("~/models") == refusal("~/no-such-thing") == expected
    assert refusal("~/../root/../elsewhere/secret.txt") == expected
    assert refusal("~root/.bashrc") == expected  # another user's home
    # a root that holds home: `~` is expanded (to $HOME), not taken as a folder named "~"
    paths.configure([home])
    assert paths.client_path("~/models", "sae") == (home / "models").resolve()
    assert paths.client_path("~/models/../models", "sae") == (home / "models").resolve()
    assert OUTSIDE in refusal("~/../elsewhere/secret.txt")


def test_a_root_given_with_tilde_is_expanded(tmp_path: Path, roots: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "sae").mkdir()
    paths.configure(["~/sae"])
    assert paths.allowed_roots() == ((tmp_path / "sae").resolve(),)
    assert paths.client_path(str(tmp_path / "sae" / "x"), "sae") == (tmp_path / "sae" / "x").resolve()


def test_the_refusal_names_the_argument_and_is_otherwise_the_same(layout: dict[str, Path]) -> None:
    secret = str(layout["outside"] / "secret.txt")
    assert refusal(secret, "sae").replace("`sae`", "`lens_path`") == refusal(secret, "lens_path")
    assert refusal(secret, "lens_path").startswith("`lens_path` names a path outside")


def test_not_a_path_is_its_own_error_and_a_nul_byte_is_a_refusal(layout: dict[str, Path]) -> None:
    with pytest.raises(InputError, match="must be a path"):
        paths.client_path("   ", "sae")
    with pytest.raises(InputError, match="must be a path"):
        paths.client_path(None, "sae")  # type: ignore[arg-type]
    # A NUL byte cannot name a file; it is refused like any path outside, not an internal error.
    assert refusal(str(layout["root"]) + "/a\x00b") == refusal(str(layout["outside"] / "missing.txt"))


def test_no_roots_refuses_every_path_even_the_environment_roots(
    tmp_path: Path, roots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.ENV, str(tmp_path))
    paths.configure([])
    (tmp_path / "file").write_text("x")
    assert paths.allowed_roots() == ()
    for value in (str(tmp_path / "file"), str(tmp_path), str(Path.cwd()), "~", "/"):
        assert f"{OUTSIDE} (allowed roots: none)" in refusal(value)


def test_stdio_defaults_and_the_environment_variable(
    tmp_path: Path, roots: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra_a, extra_b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv(paths.ENV, os.pathsep.join([str(extra_a), str(extra_b)]))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    paths.configure(None)
    allowed = paths.allowed_roots()
    assert Path.cwd().resolve() in allowed and (tmp_path / "home").resolve() in allowed
    assert allowed[-2:] == (extra_a.resolve(), extra_b.resolve())
    assert paths.client_path(str(extra_b / "sae"), "sae") == (extra_b / "sae").resolve()
    assert OUTSIDE in refusal("/etc/passwd")


# --- the CLI: how `serve` sets the roots ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--transport", "http"], ()),
        (["--transport", "http", "--allow-root", "{a}", "--allow-root", "{b}"], ("{a}", "{b}")),
        (["--transport", "stdio", "--allow-root", "{a}"], ("{a}",)),
        ([], None),
    ],
    ids=["http-none", "http-two-roots", "stdio-one-root", "stdio-defaults"],
)
def test_serve_configures_the_roots_for_its_transport(
    argv: list[str],
    expected: tuple[str, ...] | None,
    tmp_path: Path,
    roots: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "_current", limits.current())  # main() sets the limits too
    monkeypatch.setattr(cli, "_serve", lambda args: 0)  # no server: only what main() configured before serving
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli.main(["serve", "--model", "tiny", *(arg.format(a=a, b=b) for arg in argv)]) == 0
    want = None if expected is None else tuple(Path(p.format(a=a, b=b)).resolve() for p in expected)
    assert paths._roots == want


# --- the tools: no existence oracle through `sae` or `transcoders` --------------------------------------------------


@pytest.fixture
def cwd_outside(tmp_path: Path, roots: None, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The server's working directory holds a folder ``org/present`` and the allowed root is elsewhere (as over HTTP
    with --allow-root, or with no root at all)."""
    (tmp_path / "cwd" / "org" / "present").mkdir(parents=True)
    (tmp_path / "root").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    paths.configure([tmp_path / "root"])
    return tmp_path / "cwd"


def message(call, value: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as caught:
        call(value)
    return str(caught.value).replace(value, "<value>")


@pytest.mark.parametrize(
    ("present", "absent"),
    [
        ("{cwd}/org/present", "{cwd}/org/absent"),  # absolute
        ("org/present", "org/absent"),  # relative, shaped like a hub id
        ("./org/present", "./org/absent"),
    ],
)
def test_sae_gives_one_answer_for_an_existing_and_a_missing_folder_outside_the_roots(
    cwd_outside: Path, present: str, absent: str
) -> None:
    present, absent = present.format(cwd=cwd_outside), absent.format(cwd=cwd_outside)
    assert message(resolve_folder, present) == message(resolve_folder, absent)


@pytest.mark.parametrize(
    ("present", "absent"),
    [
        ("{cwd}/org/present", "{cwd}/org/absent"),
        ("org/present", "org/absent"),
        ("./org/present", "./org/absent"),
        ("{cwd}/org", "{cwd}/nothing"),  # a folder without config.yaml would list its subfolders
    ],
)
def test_transcoders_give_one_answer_for_an_existing_and_a_missing_folder_outside_the_roots(
    cwd_outside: Path, present: str, absent: str
) -> None:
    present, absent = present.format(cwd=cwd_outside), absent.format(cwd=cwd_outside)
    assert message(resolve_source, present) == message(resolve_source, absent)


def test_a_transcoder_folder_outside_the_roots_is_refused(cwd_outside: Path) -> None:
    assert OUTSIDE in message(resolve_source, str(cwd_outside / "org"))
    assert OUTSIDE in message(resolve_source, "/etc")


# --- over HTTP, end to end -----------------------------------------------------------------------------------------


async def call_sae(port: int, sae: str) -> tuple[object, object]:
    async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=120) as client:
        tools = await tools_by_name(client)
        return tools["sae"], await client.call_tool("sae", {"text": "when mary and john went", "sae": sae})


@pytest.mark.anyio
async def test_over_http_a_path_is_refused_without_allow_root_and_read_with_it(tmp_path: Path) -> None:
    sae = write_sae(tmp_path / "sae", random_weights(32, seed=1), hook="blocks.1.hook_resid_post")
    assert os.environ[paths.ENV] and Path(sae).resolve().is_relative_to(Path(os.environ[paths.ENV]))
    process, port = start_http(tmp_path)
    try:
        _, refused = await call_sae(port, sae)
        _, missing = await call_sae(port, str(tmp_path / "no-sae-here"))
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert f"{OUTSIDE} (allowed roots: none)" in error_text(refused)  # type: ignore[arg-type]
    assert error_text(refused) == error_text(missing)  # type: ignore[arg-type]

    process, port = start_http(tmp_path, "--allow-root", str(tmp_path / "sae"))
    try:
        tool, allowed = await call_sae(port, sae)
    finally:
        process.terminate()
        process.wait(timeout=30)
    data = assert_valid_structured(tool, allowed)  # type: ignore[arg-type]
    assert data["sae"]["d_sae"] == 32
