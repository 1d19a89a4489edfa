from rl_app.cli import main

raise SystemExit(main())
