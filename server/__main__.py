from tensorgate.server.cli import main

raise SystemExit(main())
