from mcp_interp.app.cli import main

raise SystemExit(main())
