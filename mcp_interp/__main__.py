from mcp_interp.cli import main

raise SystemExit(main())
