from mcp_interp.app.cli import run

run()
