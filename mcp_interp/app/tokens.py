"""Who may call an HTTP server: bearer tokens, each naming one principal.

``--auth-tokens FILE`` gives one principal per line (``NAME TOKEN``; blank lines and ``#`` comments skipped), so a team
can share one server while each researcher's ledger, stored results, jobs and exports stay their own
(``mcp.workspace``). ``--auth-token`` (or ``MCP_INTERP_AUTH_TOKEN``) is one token for one unnamed principal, as before.
Every rule is checked when the server starts, before the heavy imports (this module imports nothing that loads torch
or the SDK); a file that breaks one is refused naming the line, before anything is
served: a token shorter than ``MIN_TOKEN`` characters, a line that is not two fields, a name that is not a plain word
(it names a folder of the store), a name or a token given twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mcp_interp.errors import HttpConfigError
from mcp_interp.state.folders import PRINCIPAL_NAME

MIN_TOKEN = 16
TOKEN_ENV = "MCP_INTERP_AUTH_TOKEN"
GENERATE = "`openssl rand -hex 32`"

Principals = Mapping[str, str | None]
"""Token → the principal it names (None: the one principal of a single ``--auth-token``)."""


def single_token(token: str | None) -> Principals | None:
    """The principals of ``--auth-token`` / the environment: None when no token is set (an empty value counts as
    unset), else one unnamed principal; a token that is too short or holds whitespace is refused."""
    if token is None or token == "":
        return None
    check_token(token, "--auth-token (or MCP_INTERP_AUTH_TOKEN)")
    return {token: None}


def check_token(token: str, where: str) -> None:
    if token.strip() == "" or any(ch.isspace() for ch in token):
        raise HttpConfigError(f"{where}: a token has no whitespace (e.g. {GENERATE}).")
    if len(token) < MIN_TOKEN:
        raise HttpConfigError(f"{where}: a token must be at least {MIN_TOKEN} characters (e.g. {GENERATE}).")


def read_tokens_file(path: Path) -> Principals:
    """The principals of a tokens file: one ``NAME TOKEN`` a line. Refused (``HttpConfigError``, naming the line) on
    anything else, so a typo never becomes a principal or a token nobody meant."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HttpConfigError(f"--auth-tokens {path}: cannot read it ({type(exc).__name__}: {exc}).") from None
    principals: dict[str, str | None] = {}
    lines_of_names: dict[str, int] = {}
    lines_of_tokens: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"--auth-tokens {path}, line {number}"
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) > 2 and fields[2].startswith("#"):
            fields = fields[:2]  # a trailing comment
        if len(fields) != 2:
            raise HttpConfigError(f"{where}: expected `NAME TOKEN` (two fields), got {len(fields)}.")
        name, token = fields
        if not PRINCIPAL_NAME.fullmatch(name):
            raise HttpConfigError(
                f"{where}: the name {name[:80]!r} is not a plain name (letters, digits, '_', '.', '-'; at most 64, "
                "starting with a letter or digit)."
            )
        check_token(token, where)
        if name in lines_of_names:
            raise HttpConfigError(f"{where}: the name {name!r} is already given on line {lines_of_names[name]}.")
        if token in lines_of_tokens:
            raise HttpConfigError(
                f"{where}: this token is already given on line {lines_of_tokens[token]}; a token names one principal."
            )
        lines_of_names[name], lines_of_tokens[token] = number, number
        principals[token] = name
    if not principals:
        raise HttpConfigError(f"--auth-tokens {path}: no `NAME TOKEN` line; the file names no principal.")
    return principals
