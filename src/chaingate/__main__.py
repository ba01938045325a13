from chaingate.cli import main

raise SystemExit(main())
